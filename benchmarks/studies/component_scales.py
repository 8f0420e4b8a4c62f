"""The KL of a tracr program as one component's output is scaled toward zero.

A gradient-based mask (amortised DiffMask, the per-task mask) learns from the
KL's slope in each gate. Where the model's output is a smooth function of a
component's scale, the slope says how much the component is needed; where it is
a step (tracr's compiled MLPs discretise their inputs), the KL is flat from fully
open down to a threshold and jumps below it: the slope is zero on both sides, so
nothing keeps such a gate open while the L0 closes it, and nothing reopens it
once it is past the step. This study measures the curve per used component:
the mean KL over held-out inputs (the components suite's inputs and read-out)
with the component's output multiplied by each scale, the others intact.

Run::

    python -m benchmarks study component-scales --programs sort_freq_asc --markdown out.md
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import torch

from benchmarks.report import fmt, table, write_study_markdown
from benchmarks.suites import components as suite
from benchmarks.tasks import tracr_models as tm
from captum_diffmask import DiffMask
from captum_diffmask.model.components import gate_components
from captum_diffmask.model.divergences import example_kl, log_probs

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the KL of a tracr program as one used component's output is scaled toward zero"

#: The scales a component's output is multiplied by (1: intact, 0: zero-ablated).
SCALES = (1.0, 0.95, 0.9, 0.8, 0.6, 0.4, 0.2, 0.0)
#: A KL below this is "no change" (the model's read-out is one-hot times 10).
FLAT = 1e-4


def kl_curves(name: str, kind: str, seed: int = 0, inputs: int = 64,
              scales: Sequence[float] = SCALES) -> List[Dict[str, Any]]:
    r"""
    Per used component of ``kind`` in program ``name``, the mean KL at each scale.

    Returns:
        *list* of dicts: ``block`` (1..L), ``index``, ``kls`` (one per scale),
        ``shape``: ``"step"`` (no change at 0.9 and a change at 0: the slope is
        zero near open), ``"graded"`` (a change already at 0.9), or ``"none"``
        (no change even at 0: the component is not needed alone).
    """
    assembled = tm.compile_program(name)
    model, used = tm.convert(assembled), tm.used_components(tm.weights_of(assembled))[kind]
    ids, mask = suite.random_inputs(model, name, inputs, seed * 1000 + 999)
    explainer = DiffMask(model, mode=kind, forward_func=suite.scaled_read_out(model), padding_mask_arg=0, output="all")
    with torch.no_grad():
        original = log_probs(explainer.model_forward(ids, (mask,)))
    rows = []
    for block, site in enumerate(explainer.components, start=1):
        for index in range(site.count):
            if not used[block - 1, index]:
                continue
            kls = [_scaled_kl(explainer, ids, mask, original, site.name, index, scale) for scale in scales]
            at_09 = kls[list(scales).index(0.9)] if 0.9 in scales else kls[1]
            shape = "none" if kls[-1] < FLAT else ("step" if at_09 < FLAT else "graded")
            rows.append({"block": block, "index": index, "kls": kls, "shape": shape})
    return rows


def _scaled_kl(explainer: DiffMask, ids: torch.Tensor, mask: torch.Tensor, original: torch.Tensor, name: str,
               index: int, scale: float) -> float:
    gates = {site.name: torch.ones(ids.shape[0], site.count) for site in explainer.components}
    gates[name][:, index] = scale
    with torch.no_grad(), gate_components(explainer.components, gates):  # zeros replace the closed part
        scaled = explainer.model_forward(ids, (mask,))
    return float(example_kl(original, log_probs(scaled)).mean())


def markdown(results: Mapping[str, Mapping[str, List[Dict[str, Any]]]], command: str,
             scales: Sequence[float] = SCALES) -> str:
    r"""Per program and kind: the heads' curves in full, the units' shapes counted per block."""
    out = ["# The KL as one component's output is scaled toward zero", "",
           f"Command: `{command}`. Per used component, the mean KL over 64 held-out inputs (the components "
           "suite's inputs and read-out, seed 0) with its output multiplied by the scale, every other component "
           f"intact. *step*: no change (KL < {FLAT:g}) at 0.9 and a change at 0, so the KL's slope in the gate is "
           "zero from fully open down to the threshold; *graded*: a change already at 0.9; *none*: no change even "
           "at 0.", ""]
    for program, kinds in results.items():
        for kind, rows in kinds.items():
            out += [f"## {program}, {kind}", ""]
            if kind == "heads":
                body = [[str(r["block"]), str(r["index"]), *[fmt(v, 3) for v in r["kls"]], r["shape"]] for r in rows]
                out += [table(["block", "head", *[f"x {s:g}" for s in scales], "shape"], body), ""]
            else:
                blocks = sorted({r["block"] for r in rows})
                body = [[str(b), *[str(sum(r["block"] == b and r["shape"] == s for r in rows))
                                   for s in ("step", "graded", "none")]] for b in blocks]
                out += [table(["block", "used units: step", "graded", "none"], body), ""]
    return "\n".join(out)


def main(argv: Sequence[str] = ()) -> None:
    args, arguments = tm.study_arguments(__doc__.splitlines()[0], tm.DEVELOPMENT_PROGRAMS, argv)
    torch.set_num_threads(1)
    results: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    for name in args.programs:
        for kind in args.kinds:
            rows = kl_curves(name, kind)
            results.setdefault(name, {})[kind] = rows
            counts = {s: sum(r["shape"] == s for r in rows) for s in ("step", "graded", "none")}
            print(f"{name} {kind}: {len(rows)} used, {counts}", flush=True)
    write_study_markdown(args.markdown, "benchmarks.studies.component_scales", arguments, lambda command: markdown(results, command))


if __name__ == "__main__":  # pragma: no cover
    main()
