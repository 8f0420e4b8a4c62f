r"""
How far Integrated Gradients' signed attributions miss ``F(h) - F(b)`` at each
depth of the sst suite's fine-tuned MiniLM, on SST train sentences, under the
library's defaults (Gauss-Legendre, each sentence's mean state as the baseline) and the
authors' settings (the trapezoid rule, a zero baseline): the evidence behind
:attr:`captum_diffmask.methods.IntegratedGradients.GAP_TOLERANCE`, the gap above
which a call warns (chosen on these train sentences; no dev sentence is read).

The gap of an example is :func:`captum_diffmask.methods.gradients.completeness_gap`:
``|delta|`` over the larger of ``|F(h) - F(b)|`` and the tokens' summed absolute
scores.

Usage::

    python -m benchmarks study ig-gap --markdown docs/reproduction/ig-gap.md [--sentences 64]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional

import torch

from benchmarks.common.sst_timing import run_study
from benchmarks.methods import AUTHORS_OPTIONS
from benchmarks.report import table

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "Integrated Gradients' completeness gap per depth, at the defaults and the authors' settings (SST train)"
#: The settings compared: the library's defaults, and the authors'.
SETTINGS = {"defaults": {}, "authors": AUTHORS_OPTIONS["IntegratedGradients"]}


def measure(config: Mapping[str, Any], sentences: int, n_steps: int) -> Dict[str, Any]:
    r"""
    Each setting's relative completeness gap per sentence and depth.

    Args:

        config (Mapping): the sst suite's configuration (its model).
        sentences (int): the first SST train sentences measured (file order).
        n_steps (int): IG's points of the path integral.

    Returns:
        *dict*: ``gaps[setting][depth]`` (a list per sentence), the tolerance,
        the sentences and what the choice was made on.
    """
    from benchmarks.common.minilm.loading import load_model, subset
    from benchmarks.tasks.sst import read_sst
    from captum_diffmask.methods import IntegratedGradients
    from captum_diffmask.methods.gradients import completeness_gap
    from captum_diffmask.model.texts import text_batches

    train = subset(read_sst("train", config.get("data_dir")), config.get("train_sentences"))
    dev = read_sst("dev", config.get("data_dir"))
    model, tokenizer, _ = load_model(config, train, dev, verbose=True)
    batches = text_batches([s.text for s in train[:sentences]], tokenizer, by_length=True)

    def gaps_at(options: Mapping[str, Any], depth: int) -> List[float]:
        # path points in chunks of one batch at n_steps: the same memory whatever the steps
        ig = IntegratedGradients(model, reduction="sum", internal_batch_size=16 * n_steps,
                                 **{"n_steps": n_steps, **options})
        found: List[float] = []
        for batch in batches:
            with warnings.catch_warnings():  # the gap warnings: this study measures them
                warnings.simplefilter("ignore", UserWarning)
                scores, delta = ig.attribute(batch["input_ids"], additional_forward_args=(batch["attention_mask"],),
                                             layer=depth, return_convergence_delta=True)
            found += completeness_gap(scores, delta).tolist()
        print(f"ig-gap: {dict(options)}, depth {depth}: largest {max(found):.3g}", file=sys.stderr, flush=True)
        return found

    depths = range(int(model.config.num_hidden_layers) + 1)
    gaps = {name: {str(k): gaps_at(options, k) for k in depths} for name, options in SETTINGS.items()}
    over = [k for k, found in gaps["defaults"].items() if max(found) > IntegratedGradients.GAP_TOLERANCE]
    # the fix the warning names first, where the defaults need one: four times the steps
    more = f"defaults, {4 * n_steps} steps"
    gaps[more] = {k: gaps_at({"n_steps": 4 * n_steps}, int(k)) for k in over}
    return {"gaps": gaps, "tolerance": IntegratedGradients.GAP_TOLERANCE, "sentences": sentences, "n_steps": n_steps,
            "settings": {**SETTINGS, more: {"n_steps": 4 * n_steps}}, "chosen_on": {"tolerance": f"the first {sentences} SST train sentences (this study)"}}


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""Per setting and depth: the median, 95th percentile and largest gap, and
    the share of sentences over the tolerance."""
    tolerance = float(result["tolerance"])
    rows = []
    for name, by_depth in result["gaps"].items():
        for depth, found in by_depth.items():
            values = torch.tensor(found)
            rows.append([name, depth, f"{float(values.median()):.2g}", f"{float(values.quantile(0.95)):.2g}",
                         f"{float(values.max()):.2g}", f"{float((values > tolerance).float().mean()):.0%}"])
    return "\n".join([
        "# Integrated Gradients' completeness gap, per depth", "",
        f"Command: `{command}`. The sst suite's fine-tuned MiniLM, the first {result['sentences']} SST train "
        f"sentences (no dev sentence is read), {result['n_steps']} steps, the signed attributions "
        "(`reduction=\"sum\"`). The gap of a sentence is `|delta|` over the larger of `|F(h) - F(b)|` and the "
        "tokens' summed absolute scores; the library warns above the tolerance "
        f"{tolerance} (`IntegratedGradients.GAP_TOLERANCE`).", "",
        table(["settings", "depth", "median gap", "95th percentile", "largest", f"over {tolerance}"], rows), "",
        "`defaults`: Gauss-Legendre and each sentence's mean state over its real tokens as the baseline; `authors`: the "
        "trapezoid rule and a zero baseline, as the paper's suites run it (`benchmarks.methods.AUTHORS_OPTIONS`); "
        "the defaults with four times the steps (the first fix the warning names) at the depths where some sentence "
        "is over the tolerance at the defaults. A gap of 0 is a delta within float rounding (1e-6).", "", _over(result["gaps"], tolerance), ""])


def _over(gaps: Mapping[str, Mapping[str, List[float]]], tolerance: float) -> str:
    r"""Per setting, the depths where some sentence's gap is over the tolerance,
    with the share of sentences."""
    parts = []
    for name, by_depth in gaps.items():
        over = {depth: sum(g > tolerance for g in found) / len(found) for depth, found in by_depth.items()}
        shown = ", ".join(f"depth {depth} {share:.0%}" for depth, share in over.items() if share > 0)
        parts.append(f"`{name}`: {shown or 'none'}")
        parts[-1] += f" (of {len(by_depth)} depths)"
    return f"Sentences over the tolerance {tolerance}: " + "; ".join(parts) + "."


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study ig-gap", description=__doc__.split("\n\n")[1])
    parser.add_argument("--markdown", required=True, help="where the report is written (its JSON beside it)")
    parser.add_argument("--sentences", type=int, default=64, help="SST train sentences measured (default: 64)")
    parser.add_argument("--steps", type=int, default=50, help="IG's steps (default: 50)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--set", dest="overrides", default="{}", help="JSON merged into the sst suite's configuration")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.steps < 2:
        parser.error("--sentences must be at least 1 and --steps at least 2")
    return run_study("benchmarks.studies.ig_gap", argv, args.markdown, args.threads, args.overrides,
                     lambda config: measure(config, args.sentences, args.steps), markdown)


if __name__ == "__main__":
    sys.exit(main())
