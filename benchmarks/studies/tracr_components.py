r"""
Component masks against a ground truth that no one here wrote: which heads and
MLP units tracr placed each program's computations in.

For every program (tracr compiles it, :mod:`benchmarks.tasks.tracr_models`
converts it) and both kinds of component, three methods score every component
for every held-out input:

- amortised DiffMask (``DiffMask(mode=kind)``: a probe reads each input), fitted
  once on the training inputs with fit's defaults;
- the per-task mask (``per_task=True``: one mask for every input, Subnetwork
  Probing), at lr 0.03 (fit's 3e-3 moves a bias too slowly, see
  ``docs/guide/components.md``);
- attribution patching (:class:`~captum_diffmask.methods.AttributionPatching`).

Closed components are replaced by zeros, fixed (zero ablation: an unused
component outputs zero, and "used" means non-zero weights). The model's read-out
is tracr's output space, one-hot, scaled by 10 as logits, so that the decoded
token has probability >= 0.99 and a changed token costs KL of about 10 at its
position. Per input, the ROC AUC of the scores against the used components
(those of every block together); the mean over inputs. For the masks also the KL
of the model with every block's kept components at once (each block was fitted
with the others intact), and the cost: fit seconds, attribution seconds per input,
and the per-task mask refitted on one input. Every fit runs to fit's own verdict
or budget (capped at 300 steps with ``--quick``); each block's verdict is reported.

Usage::

    python -m benchmarks.studies.tracr_components --out tracr.jsonl [--programs reverse sort] [--quick]
    python -m benchmarks.studies.tracr_components --out tracr.jsonl --markdown docs/results/tracr-components.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from captum_diffmask import DiffMask
from captum_diffmask.components import gate_components
from captum_diffmask.methods import AttributionPatching
from captum_diffmask.objective import example_kl, log_probs

from ..records import to_jsonable
from ..tasks.tracr_models import compile_program, convert, PROGRAMS, used_components, weights_of

#: The programs scored by default: each leaves some heads and units unused.
DEFAULT_PROGRAMS = ("reverse", "sort", "sort_freq")
#: The read-out's scale: tracr's one-hot output space times this are the logits.
LOGIT_SCALE = 10.0
#: The per-task mask's learning rate (a bias moves about lr a step under Adam).
PER_TASK_LR = 0.03
#: Every fit's step cap (full run: None, fit's own budget; quick run).
MAX_STEPS: Tuple[Optional[int], int] = (None, 300)
#: Inputs the per-task mask is refitted on alone, for its cost per input.
REFIT_INPUTS = 2


def roc_auc(scores: np.ndarray, truth: np.ndarray) -> float:
    r"""The ROC AUC of ``scores`` against the boolean ``truth`` (ties count
    half): the chance that a used component scores above an unused one."""
    positive, negative = scores[truth], scores[~truth]
    if not len(positive) or not len(negative):
        return float("nan")
    above = (positive[:, None] > negative[None, :]).sum() + 0.5 * (positive[:, None] == negative[None, :]).sum()
    return float(above / (len(positive) * len(negative)))


def random_inputs(model: Any, name: str, count: int, seed: int) -> Tuple[Tensor, Tensor]:
    r"""(count, T) ids and padding mask: BOS and 1 .. T - 1 tokens drawn uniformly."""
    _, vocabulary, length = PROGRAMS[name]
    rng = np.random.default_rng(seed)
    ids = torch.full((count, length), model.vocabulary["compiler_pad"])
    mask = torch.zeros(count, length, dtype=torch.long)
    for row in range(count):
        size = int(rng.integers(2, length + 1))
        if name == "sort_unique":
            picks = rng.permutation(len(vocabulary))[: size - 1]
        else:
            picks = rng.integers(len(vocabulary), size=size - 1)
        ids[row, :size] = model.encode(["BOS"] + [vocabulary[i] for i in picks])[0]
        mask[row, :size] = 1
    return ids, mask


def scaled_read_out(model: torch.nn.Module) -> Any:
    r"""``forward_func``: the converted model's output space times :data:`LOGIT_SCALE`, as logits."""
    return lambda ids, mask: LOGIT_SCALE * model(ids, mask)


def _zeros(explainer: Any) -> Dict[int, Tensor]:
    return {site.layer: torch.zeros(site.count, site.width) for site in explainer.components}


def kept_kl(model: torch.nn.Module, explainer: DiffMask, ids: Tensor, mask: Tensor) -> float:
    r"""The mean KL of the model with every block's deterministic gates at once."""
    masked = explainer.masked_forward_layers(ids, (mask,))
    gates = {f"{explainer.mode}.{k}": g for k, (g, _, _) in masked.items()}
    with torch.no_grad():
        original = log_probs(explainer.model_forward(ids, (mask,)))
        with gate_components(explainer.components, gates):
            kept = log_probs(explainer.model_forward(ids, (mask,)))
    return float(example_kl(original, kept).mean())


def score_mask(model: torch.nn.Module, kind: str, per_task: bool, train: List[Tuple[Tensor, Tensor]],
               held: Tuple[Tensor, Tensor], seed: int, max_steps: Optional[int]) -> Dict[str, Any]:
    r"""One mask fitted on ``train`` and read on the held-out inputs."""
    explainer = DiffMask(model, mode=kind, forward_func=scaled_read_out(model), padding_mask_arg=0, output="all",
                         per_task=per_task)
    options: Dict[str, Any] = {"init_baseline": _zeros(explainer), "lr_baseline": 0.0, "seed": seed, "verbose": False}
    if per_task:
        options["lr"] = PER_TASK_LR
    if max_steps is not None:
        options["max_steps"] = max_steps
    start = time.perf_counter()
    with _quiet():
        history = explainer.fit(train, **options)
    fit_seconds = time.perf_counter() - start
    ids, mask = held
    start = time.perf_counter()
    scores = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    attribute_seconds = (time.perf_counter() - start) / ids.shape[0]
    return {"scores": scores, "fit_seconds": fit_seconds, "attribute_seconds": attribute_seconds,
            "steps": int(sum(row["steps"] for row in history)) // max(len(explainer.components), 1),
            "verdicts": {k: v["status"] for k, v in explainer.convergence.items()},
            "kept_kl": kept_kl(model, explainer, ids, mask), "kept_share": float((scores > 0.5).float().mean())}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def score_program(name: str, seed: int, quick: bool) -> List[Dict[str, Any]]:
    r"""Every method on both kinds of component of one program."""
    assembled = compile_program(name)
    weights = weights_of(assembled)
    if not weights.categorical:
        raise ValueError(f"programs: {name} has a numerical output, which has no KL; choose a categorical one")
    model = convert(assembled)
    used = used_components(weights)
    batches = 4 if quick else 16
    train = [random_inputs(model, name, 32, seed * 1000 + b) for b in range(batches)]
    held = random_inputs(model, name, 16 if quick else 64, seed * 1000 + 999)
    steps = MAX_STEPS[1] if quick else MAX_STEPS[0]
    lines = []
    for kind in ("heads", "units"):
        truth = used[kind].reshape(-1)
        results = {
            "DiffMask": score_mask(model, kind, False, train, held, seed, steps),
            "per-task mask": score_mask(model, kind, True, train, held, seed, steps),
        }
        patching = AttributionPatching(model, kind=kind, forward_func=scaled_read_out(model), padding_mask_arg=0,
                                       output="all")
        start = time.perf_counter()
        scores = patching.attribute(held[0], additional_forward_args=(held[1],))
        results["attribution patching"] = {"scores": scores,
                                           "attribute_seconds": (time.perf_counter() - start) / held[0].shape[0]}
        one = [random_inputs(model, name, 1, seed * 1000 + 500 + i) for i in range(REFIT_INPUTS)]
        refits = [score_mask(model, kind, True, [example], example, seed, steps)["fit_seconds"] for example in one]
        for method, result in results.items():
            scores = result.pop("scores").reshape(held[0].shape[0], -1).numpy()
            aucs = [roc_auc(row, truth) for row in scores]
            result["mean_score_used"], result["mean_score_unused"] = float(scores[:, truth].mean()), float(scores[:, ~truth].mean())
            lines.append({"program": name, "kind": kind, "method": method, "seed": seed,
                          "components": int(truth.size), "used": int(truth.sum()),
                          "auc": statistics.fmean(aucs), "auc_min": min(aucs), "inputs": len(aucs),
                          "per_task_refit_seconds": statistics.fmean(refits), **result})
    return lines


def summary(lines: Sequence[Mapping[str, Any]]) -> str:
    r"""The markdown table of the lines."""
    rows = ["| program | component | used / all | method | ROC AUC (mean, min over inputs) | verdicts | "
            "KL kept | kept share | fit (s) | attribution per input (µs) | refitted on one input (s) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for line in lines:
        verdicts = ", ".join(f"{k}: {v}" for k, v in line.get("verdicts", {}).items()) or "-"
        kl = f"{line['kept_kl']:.3f}" if "kept_kl" in line else "-"
        share = f"{line['kept_share']:.2f}" if "kept_share" in line else "-"
        fit = f"{line['fit_seconds']:.0f}" if "fit_seconds" in line else "-"
        refit = f"{line['per_task_refit_seconds']:.0f}" if line["method"] == "per-task mask" else "-"
        rows.append(f"| {line['program']} | {line['kind']} | {line['used']} / {line['components']} | {line['method']} | "
                    f"{line['auc']:.3f} ({line['auc_min']:.3f}) | {verdicts} | {kl} | {share} | {fit} | "
                    f"{1e6 * line['attribute_seconds']:.0f} | {refit} |")
    return "\n".join(rows)


def report(lines: Sequence[Mapping[str, Any]], out: Path) -> str:
    r"""The markdown report: what was measured, the command, the table."""
    programs = sorted({line["program"] for line in lines})
    return "\n".join([
        "# Component masks against tracr's ground truth",
        "",
        "Programs compiled by tracr (" + ", ".join(f"`{p}`: {PROGRAMS[p][0]}" for p in programs) + ") and "
        "converted to PyTorch (`benchmarks/tasks/tracr_models.py`). A component is *used* when tracr gave it "
        "non-zero weights. Per held-out input, the ROC AUC of a method's scores over every head (or every MLP "
        "unit) of every block against the used ones; the mean and the minimum over the inputs. Closed "
        "components are replaced by zeros (fixed). The read-out is tracr's one-hot output space times "
        f"{LOGIT_SCALE:g} as logits (output `all`: every real position's distribution).",
        "",
        "- **DiffMask**: `DiffMask(mode=kind)`, amortised (a probe reads each input), fit's defaults "
        "(eps 0.1, to its own verdict or budget), on 16 batches of 32 random inputs.",
        f"- **per-task mask**: `per_task=True` (one mask for every input, Subnetwork Probing), lr {PER_TASK_LR:g}; "
        f"its last column: the same mask refitted on one input alone (mean over {REFIT_INPUTS}), the cost of a "
        "per-input mask without amortisation.",
        "- **attribution patching**: `AttributionPatching(kind=...)`, zero baseline, the predicted tokens' "
        "log-probability; no mask (no verdict, no KL).",
        "",
        "Verdicts are per block (layer k = block k). *KL kept*: the model with every block's deterministic "
        "gates at once (each block was fitted with the others intact), mean over inputs; *kept share*: the "
        "share of components with P(kept) > 0.5.",
        "",
        f"Command: `python -m benchmarks.studies.tracr_components --out {out} --threads 1` then "
        f"`--markdown` (lines in `{out.name}`). 2 cores, shared with another benchmark while it ran.",
        "",
        summary(lines),
        "",
    ])


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.tracr_components",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--out", required=True, help="JSON-lines file (appended; programs already there skipped)")
    parser.add_argument("--programs", nargs="+", default=list(DEFAULT_PROGRAMS), choices=sorted(PROGRAMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 training batches, 16 inputs, 300 steps a fit")
    parser.add_argument("--markdown", default=None, help="write the report of --out to this file, run nothing")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    out = Path(args.out)
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.exists() else []
    if args.markdown:
        Path(args.markdown).write_text(report(lines, out))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    done = {line["program"] for line in lines}
    for name in args.programs:
        if name in done:
            continue
        new = score_program(name, args.seed, args.quick)
        with open(out, "a") as handle:
            for line in new:
                handle.write(json.dumps(to_jsonable(line)) + "\n")
        lines += new
        print(summary([line for line in lines if line["program"] == name]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
