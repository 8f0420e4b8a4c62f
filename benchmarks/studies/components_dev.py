"""The component modes' settings measured on the development tracr programs.

Amortised DiffMask over heads or MLP units with fit's options changed (variants),
on programs the components suite never reports
(:data:`~benchmarks.tasks.tracr_models.DEVELOPMENT_PROGRAMS`): per program, kind
and variant the ROC AUC against the components the program uses and against
those active on the input, the KL of the model with every block's kept
components, the kept share and each block's verdict. The inputs and the fit are
the suite's (:func:`benchmarks.suites.components.tracr.score_mask`, seed 0 unless
``--seed`` says another).

Run::

    python -m benchmarks study components-dev --markdown docs/results/components-dev.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from benchmarks.report import fmt, table, write_study_markdown
from benchmarks.suites import components as suite
from benchmarks.tasks import tracr_models as tm

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "amortised DiffMask's component-mode variants on the development tracr programs"

#: The variants compared by default: the suite's earlier one and those it runs now.
VARIANTS: Dict[str, Dict[str, Any]] = {
    "l0_floor 0.05": {"l0_floor": 0.05},
    "l0_floor 0.05, lr 1e-3": {"l0_floor": 0.05, "lr": 1e-3},
    "joint, l0_floor 0.05, lr 1e-3": {"joint": True, "l0_floor": 0.05, "lr": 1e-3},
    "joint, l0_floor 0.1, lr 1e-3": {"joint": True, "l0_floor": 0.1, "lr": 1e-3},
}


def score(name: str, kind: str, variants: Mapping[str, Mapping[str, Any]], seed: int = 0,
          max_steps: Optional[int] = None) -> List[Dict[str, Any]]:
    r"""One row per variant of amortised DiffMask on ``kind`` of program ``name``
    (``max_steps``: a cap on each fit, for tests; None: fit's own budget)."""
    assembled = tm.compile_program(name)
    weights, model = tm.weights_of(assembled), tm.convert(assembled)
    used = tm.used_components(weights)[kind]
    train = [suite.random_inputs(model, name, 32, seed * 1000 + b) for b in range(16)]
    held = suite.random_inputs(model, name, 64, seed * 1000 + 999)
    active = suite.active_components(model, *held)[kind].numpy()
    rows = []
    for label, options in variants.items():
        start = time.perf_counter()
        result = suite.score_mask(model, kind, False, train, held, seed, max_steps, options)
        rows.append({"program": name, "kind": kind, "variant": label, "seed": seed, "used": int(used.sum()),
                     "components": int(used.size), **suite.against_truth(result["scores"], used, active),
                     "kept_kl": result["kept_kl"], "kept_share": result["kept_share"], "verdicts": result["verdicts"],
                     "seconds": time.perf_counter() - start})
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], command: str) -> str:
    r"""The rows as a report: a table, and each variant's mean AUC over the pairs."""
    body = [[r["program"], r["kind"], f"{r['used']} / {r['components']}", r["variant"], fmt(r["auc"], 3),
             fmt(r["auc_active"], 3), fmt(r["kept_kl"], 3), fmt(r["kept_share"], 2),
             ", ".join(f"{k}: {v}" for k, v in r["verdicts"].items())] for r in rows]
    means = {}
    for r in rows:
        means.setdefault(r["variant"], []).append(r["auc"])
    summary = [f"- {variant}: mean ROC AUC (used) {fmt(sum(v) / len(v), 3)} over {len(v)} program x kind pairs."
               for variant, v in means.items()]
    return "\n".join([
        "# Component masks on the development tracr programs", "",
        f"Command: `{command}`. Amortised DiffMask (the components suite's inputs and fit, seed "
        f"{', '.join(sorted({str(r['seed']) for r in rows}))}) with fit's "
        "options changed; programs the suite never reports. ROC AUC per held-out input against the components "
        "the program uses and against those active on the input; KL of the model with every block's kept "
        "components; kept share; each block's verdict.", "",
        table(["program", "kind", "used", "variant", "ROC AUC (used)", "ROC AUC (active)", "KL kept", "kept",
               "verdicts"], body), "", *summary, ""])


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=list(tm.DEVELOPMENT_PROGRAMS))
    parser.add_argument("--kinds", nargs="+", default=["units", "heads"])
    parser.add_argument("--variants", default=None, help="JSON: label -> fit options (default: VARIANTS)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the inputs' and the fits' seed")
    parser.add_argument("--markdown", default=None, help="write the report here")
    arguments = list(argv) or sys.argv[1:]
    args = parser.parse_args(arguments)
    unknown = [p for p in args.programs if p not in tm.DEVELOPMENT_PROGRAMS]
    if unknown:
        parser.error(f"--programs: {unknown} are not development programs {tm.DEVELOPMENT_PROGRAMS}")
    torch.set_num_threads(args.threads)
    variants = json.loads(args.variants) if args.variants else VARIANTS
    rows = []
    with suite.quiet_warnings():
        for name in args.programs:
            for kind in args.kinds:
                for row in score(name, kind, variants, seed=args.seed):
                    rows.append(row)
                    print(f"{name} {kind} {row['variant']}: AUC {row['auc']:.3f}, active {row['auc_active']:.3f}, "
                          f"KL {row['kept_kl']:.3f}, {row['verdicts']} ({row['seconds']:.0f} s)", flush=True)
    write_study_markdown(args.markdown, "benchmarks.studies.components_dev", arguments, lambda command: markdown(rows, command))


if __name__ == "__main__":  # pragma: no cover
    main()
