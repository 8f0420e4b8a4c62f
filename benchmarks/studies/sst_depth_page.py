r"""The page that shows when the SST MiniLM knows which words it needs: the
depth view of a probe saved the way models are shared.

Command: ``python -m benchmarks study sst-depth-page --markdown docs/results/sst-depth.md``
(the page itself, ``sst-depth.html``, beside it). The probe is the sst suite's
input-mode fit of seed 0 (its settings, sentences and certificate, through the
fit cache: the suite's run reuses it, and a stopped fit resumes), saved with
``save_pretrained`` and loaded back with ``DiffMask.from_pretrained`` (no
pickle); ``--probe`` draws another saved probe of the same model instead. It
explains the first dev sentence of at most ``--max-words`` words of each
sentiment extreme and of the neutral class at every depth, with Integrated
Gradients at the embeddings beside.
"""

from __future__ import annotations

import argparse
import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "When does the SST MiniLM know which words it needs: the depth page of the sst suite's input probe"
#: What the page draws, for the report.
DRAWN = ("It explains the first dev sentence of at most `--max-words` words of each sentiment extreme and of the "
         "neutral class at every depth, with Integrated Gradients (50 steps) at the embeddings beside.")
#: Where the suite's probe comes from, for the report.
SETUP = ("The probe is the sst suite's input-mode fit of seed 0 (`python -m benchmarks run sst`'s settings: "
         "batch 32, eps {eps}, the L0 as the share kept, at most 5 000 steps, on the train sentences less the suite's "
         "400 validation ones, and its convergence certificate), saved with `save_pretrained` and loaded here with "
         "`DiffMask.from_pretrained` (no pickle). " + DRAWN + " A depth counts when its fit settled, its held-out "
         "KL is within the bound and the certificate counts it (the sst suite's rule).")
#: The seed of the suite's fit the page draws.
SEED = 0
#: Where the suite's probe is saved (``save_pretrained``), in the fit cache.
SUITE_PROBE = "sst-suite-input-seed0-probe"
#: The classes a sentence is drawn from (SST-5: 0 very negative, 2 neutral, 4 very positive).
LABELS = (0, 2, 4)


def pick_sentences(sentences: Sequence[Any], labels: Sequence[int] = LABELS, max_words: int = 16) -> List[Any]:
    r"""The first sentence of each label in ``labels`` with at most ``max_words``
    words, in the order of ``labels`` (a label with none is left out)."""
    picked = []
    for label in labels:
        found = next((s for s in sentences if s.label == label and len(s.words) <= max_words), None)
        if found is not None:
            picked.append(found)
    return picked


def depth_page(dm: Any, model: Any, tokenizer: Any, texts: Sequence[str], ig_steps: int = 50) -> Dict[str, Any]:
    r"""
    The depth view of ``dm`` on ``texts`` with Integrated Gradients beside.

    Args:

        dm (DiffMask): a fitted input-mode probe of ``model``.
        model (nn.Module): the classifier.
        tokenizer: its fast tokenizer.
        texts (sequence of str): the texts shown.
        ig_steps (int, optional): Integrated Gradients' steps. Default: 50

    Returns:
        *dict* with ``html`` (the page), ``words`` (per text its words) and
        ``keep`` (per text, per word, per depth the keep probability: lists of
        shape (words, L + 1)), ``columns`` and ``verdicts`` (per depth).
    """
    from benchmarks.methods import AUTHORS_OPTIONS
    from captum_diffmask import depth_view, explain, IntegratedGradients

    diffmask = explain(dm, list(texts), tokenizer, layer=None)
    ig = explain(IntegratedGradients(model, **AUTHORS_OPTIONS["IntegratedGradients"]), list(texts), tokenizer, layer=0,
                 n_steps=ig_steps)
    title = "When the SST MiniLM knows which words it needs"
    return {"html": depth_view(diffmask, [ig], title=title), "words": [list(w) for w in diffmask.words],
            "keep": [scores.tolist() for scores in diffmask.word_scores], "columns": list(diffmask.columns),
            "verdicts": list(diffmask.verdicts or [])}


def markdown(data: Dict[str, Any], command: str, html_name: str) -> str:
    r"""The report: what was drawn, each depth's verdict (and whether it counts,
    when the run says), and per sentence the mean keep probability at every
    depth (the page has every word)."""
    columns, counts = data["columns"], data.get("counts")
    verdicts = [f"{c} {v}" + ("" if counts is None else f" ({'counts' if counts[str(k)] else 'does not count'})")
                for k, (c, v) in enumerate(zip(columns, data["verdicts"]))]
    lines = ["# When the SST MiniLM knows which words it needs", "",
             f"Command: `{command}`. The page: [{html_name}]({html_name}) (self-contained; open it in a browser, "
             f"move the slider over the depths). {data['setup']}", "",
             _headline(data), "",
             f"The probe ({data['probe']}): {data['fit']['steps']} steps over {data['fit']['epochs']} epochs"
             + (f" of {data['fit']['examples_per_epoch']} sentences" if data["fit"].get("examples_per_epoch") else "")
             + "; its verdicts per depth: " + ", ".join(verdicts) + ".", "",
             "Mean keep probability of each sentence's words at every depth (input mode: the probability that a "
             "probe reading the model up to that depth keeps the word):", "",
             "| sentence | label | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for sentence, words, keep in zip(data["sentences"], data["words"], data["keep"]):
        means = [sum(row[k] for row in keep) / len(keep) for k in range(len(columns))]
        lines.append(f"| {' '.join(words)} | {sentence['label']} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines) + "\n"


def _headline(data: Dict[str, Any]) -> str:
    depths, counts = len(data["verdicts"]), data.get("counts")
    if counts is not None:
        return (f"**{sum(counts.values())} of {depths} depths count under the sst suite's rule (settled, within the "
                "bound, certified)**")
    from captum_diffmask.diffmask.constrained.convergence import SETTLED

    settled = sum(v in SETTLED for v in data["verdicts"])
    return f"**{settled} of {depths} depths settled (no certificate for this probe)**"


def suite_probe(directory: Path, data_dir: Optional[str]) -> Tuple[Any, Any, Dict[str, Any], str]:
    r"""
    The sst suite's input-mode fit of seed :data:`SEED` (through the fit cache,
    with its certificate), saved to ``directory`` with ``save_pretrained``.

    Returns:
        *tuple* ``(model, tokenizer, counts, setup)``: per depth (str) whether
        the probe counts under the suite's rule, and the report's setup text.
    """
    from benchmarks.common.minilm.fit_cache import certified_fit
    from benchmarks.common.minilm.fitting import certify_fit, fit_diffmask
    from benchmarks.common.minilm.loading import load_bench
    from benchmarks.suites.sst import counted_layers, DEFAULTS

    config = {**copy.deepcopy(DEFAULTS), "data_dir": data_dir}
    bench = load_bench(config, verbose=True)
    explainer, info = certified_fit(fit_diffmask, certify_fit, bench.model, "input", bench.train, bench.valid, config,
                                    SEED, True)
    explainer.save_pretrained(directory)
    counts = {str(k): c["counts"] for k, c in counted_layers(info).items()}
    return bench.model, bench.tokenizer, counts, SETUP.format(eps=config["diffmask"]["eps"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    from benchmarks.common.minilm.loading import load_model
    from benchmarks.records import cache_dir
    from benchmarks.suites.sst import DEFAULTS
    from benchmarks.tasks.sst import read_sst
    from captum_diffmask import DiffMask

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", required=True, help="write the report here (the page and the JSON beside it)")
    parser.add_argument("--probe", help="a save_pretrained directory of an input-mode probe of the sst suite's "
                        "MiniLM (default: the sst suite's seed-0 fit, fitted or drawn from the fit cache)")
    parser.add_argument("--data-dir", help="the SST files (default: $CAPTUM_DIFFMASK_DATA, else ../shared/data)")
    parser.add_argument("--max-words", type=int, default=16, help="the longest sentence drawn (default: 16)")
    args = parser.parse_args(argv)
    dev = read_sst("dev", args.data_dir)
    if args.probe:
        probe = Path(args.probe)
        if not (probe / "config.json").is_file():
            parser.error(f"--probe: no save_pretrained directory at {str(probe)!r}")
        model, tokenizer, _ = load_model(copy.deepcopy(DEFAULTS), read_sst("train", args.data_dir), dev, verbose=True)
        counts, setup = None, f"The probe is the save_pretrained directory `{probe.name}`. {DRAWN}"
    else:
        probe = cache_dir() / SUITE_PROBE
        model, tokenizer, counts, setup = suite_probe(probe, args.data_dir)
    dm = DiffMask.from_pretrained(probe, model)
    sentences = pick_sentences(dev, max_words=args.max_words)
    data = depth_page(dm, model, tokenizer, [" ".join(s.words) for s in sentences])
    out = Path(args.markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    html_path = out.with_suffix(".html")
    html_path.write_text(data.pop("html"), encoding="utf-8")
    fit = json.loads((probe / "fit_record.json").read_text(encoding="utf-8"))["fit"]
    data.update({"probe": probe.name, "setup": setup, "counts": counts,
                 "fit": {key: fit.get(key) for key in ("steps", "epochs", "examples_per_epoch")},
                 "sentences": [{"text": " ".join(s.words), "label": s.label} for s in sentences],
                 "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    command = "python -m benchmarks study sst-depth-page" + (f" --probe {args.probe}" if args.probe else "") + \
        f" --markdown {args.markdown}"
    out.write_text(markdown(data, command, html_path.name), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    print(out.read_text())
    return 0
