r"""The page that shows when the SST MiniLM knows which words it needs: the
depth view of a probe saved the way models are shared.

Command: ``python -m benchmarks study sst-depth-page --markdown docs/results/sst-depth.md``
(the page itself, ``sst-depth.html``, beside it). The probe is the user-path
study's default fit (``DiffMask(model, mode="input").fit(texts, tokenizer=...)``
with every option at its default on all SST train sentences, on the sst suite's
fine-tuned MiniLM), which that study saves with ``save_pretrained``; here it is
loaded with ``DiffMask.from_pretrained`` (no pickle) and explains the first dev
sentence of at most ``--max-words`` words of each sentiment extreme and of the
neutral class at every depth, with Integrated Gradients at the embeddings beside.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "When does the SST MiniLM know which words it needs: the depth page of its default fit's probe"
#: What the page shows, for the report.
SETUP = ("The probe is the user-path study's default fit (`DiffMask(model, mode=\"input\").fit(texts, "
         "tokenizer=tokenizer)` with every option at its default on all SST train sentences, on the sst suite's "
         "fine-tuned MiniLM), saved there with `save_pretrained` and loaded here with `DiffMask.from_pretrained` "
         "(no pickle). It explains the first dev sentence of at most `--max-words` words of each sentiment "
         "extreme and of the neutral class at every depth, with Integrated Gradients (50 steps) at the "
         "embeddings beside.")
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
    from captum_diffmask import depth_view, explain, IntegratedGradients

    diffmask = explain(dm, list(texts), tokenizer, layer=None)
    ig = explain(IntegratedGradients(model), list(texts), tokenizer, layer=0, n_steps=ig_steps)
    title = "When the SST MiniLM knows which words it needs"
    return {"html": depth_view(diffmask, [ig], title=title), "words": [list(w) for w in diffmask.words],
            "keep": [scores.tolist() for scores in diffmask.word_scores], "columns": list(diffmask.columns),
            "verdicts": list(diffmask.verdicts or [])}


def markdown(data: Dict[str, Any], command: str, html_name: str) -> str:
    r"""The report: what was drawn, each depth's verdict and per sentence the
    mean keep probability at every depth (the page has every word)."""
    columns = data["columns"]
    lines = ["# When the SST MiniLM knows which words it needs", "",
             f"Command: `{command}`. The page: [{html_name}]({html_name}) (self-contained; open it in a browser, "
             f"move the slider over the depths). {SETUP}", "",
             f"The probe ({data['probe']}): {data['fit']['steps']} steps over {data['fit']['epochs']} epochs of "
             f"{data['fit']['examples_per_epoch']} sentences; its verdicts per depth: " + ", ".join(f"{c} {v}" for c, v in zip(columns, data["verdicts"])) + ".", "",
             "Mean keep probability of each sentence's words at every depth (input mode: the probability that a "
             "probe reading the model up to that depth keeps the word):", "",
             "| sentence | label | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for sentence, words, keep in zip(data["sentences"], data["words"], data["keep"]):
        means = [sum(row[k] for row in keep) / len(keep) for k in range(len(columns))]
        lines.append(f"| {' '.join(words)} | {sentence['label']} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    import copy

    from benchmarks.common.minilm.loading import load_model
    from benchmarks.records import cache_dir
    from benchmarks.studies.user_path import DEFAULT_FIT_PROBE
    from benchmarks.suites.sst import DEFAULTS
    from benchmarks.tasks.sst import read_sst
    from captum_diffmask import DiffMask

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", required=True, help="write the report here (the page and the JSON beside it)")
    parser.add_argument("--probe", help="a save_pretrained directory of an input-mode probe of the sst suite's "
                        "MiniLM (default: the user-path study's default fit, in the fit cache)")
    parser.add_argument("--data-dir", help="the SST files (default: $CAPTUM_DIFFMASK_DATA, else ../shared/data)")
    parser.add_argument("--max-words", type=int, default=16, help="the longest sentence drawn (default: 16)")
    args = parser.parse_args(argv)
    probe = Path(args.probe) if args.probe else cache_dir() / DEFAULT_FIT_PROBE
    if not (probe / "config.json").is_file():
        parser.error(f"--probe: no save_pretrained directory at {str(probe)!r} (run `python -m benchmarks study "
                     "user-path --parts default-fit` first, or pass --probe)")
    train, dev = read_sst("train", args.data_dir), read_sst("dev", args.data_dir)
    model, tokenizer, _ = load_model(copy.deepcopy(DEFAULTS), train, dev, verbose=True)
    dm = DiffMask.from_pretrained(probe, model)
    sentences = pick_sentences(dev, max_words=args.max_words)
    data = depth_page(dm, model, tokenizer, [" ".join(s.words) for s in sentences])
    out = Path(args.markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    html_path = out.with_suffix(".html")
    html_path.write_text(data.pop("html"), encoding="utf-8")
    fit = json.loads((probe / "fit_record.json").read_text(encoding="utf-8"))["fit"]
    data.update({"probe": probe.name, "fit": {key: fit.get(key) for key in ("steps", "epochs", "examples_per_epoch")},
                 "sentences": [{"text": " ".join(s.words), "label": s.label} for s in sentences],
                 "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    command = f"python -m benchmarks study sst-depth-page --markdown {args.markdown}"
    out.write_text(markdown(data, command, html_path.name), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    print(out.read_text())
    return 0
