"""Against tracr's "used" components, the score that follows each input's own
activity: a reference line, not a ceiling.

The components suite scores each held-out input's component scores against the
components the compiled program uses anywhere (ROC AUC per input, averaged).
On one input, a used component that is idle there (its output or activation
zero at every real position) does nothing: closing it changes no output, just as
closing an unused one. A score that follows the input's own activity
exactly (1 for the used components active on the input, 0 for every other)
is what the input's own effects support; this study gives its ROC AUC against
the used components, per program, kind and seed (the suite's held-out inputs),
with the share of used components active on an input. It is not an upper
bound: a method can exceed it by scoring idle used components above unused
ones, from what it carries across inputs, not from the input it explains.

Run::

    python -m benchmarks study component-activity --markdown docs/results/components-activity.md
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from benchmarks.report import fmt, table, write_study_markdown
from benchmarks.suites import components as suite
from benchmarks.suites.components import DEFAULTS
from benchmarks.tasks import tracr_models as tm

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the ROC AUC against tracr's used components of a score that follows each input's own activity (a reference line)"


def activity_line(name: str, kind: str, seeds: Sequence[int], inputs: int = DEFAULTS["tracr"]["held_out"]) -> List[Dict[str, Any]]:
    r"""
    Per seed, the activity-following score's ROC AUC against the used components.

    Returns:
        *list* of dicts (one per seed): ``program``, ``kind``, ``seed``,
        ``used`` and ``components`` (counts), ``active_share`` (mean share of
        the used components active on an input), ``auc`` and ``auc_min`` (mean
        and minimum over the inputs).
    """
    assembled = tm.compile_program(name)
    model, used = tm.convert(assembled), tm.used_components(tm.weights_of(assembled))[kind]
    rows = []
    for seed in seeds:
        held = suite.random_inputs(model, name, inputs, seed * 1000 + 999)  # the suite's held-out inputs
        active = suite.active_components(model, *held)[kind].numpy() & used[None]
        scores = torch.from_numpy(active.astype(np.float32))
        measured = suite.against_truth(scores, used, active)
        rows.append({"program": name, "kind": kind, "seed": seed, "used": int(used.sum()), "components": int(used.size),
                     "active_share": float(active.reshape(inputs, -1).sum(1).mean() / used.sum()),
                     "auc": measured["auc"], "auc_min": measured["auc_min"]})
    return rows


def markdown(rows: Sequence[Dict[str, Any]], command: str) -> str:
    r"""The rows as a report."""
    body = [[r["program"], r["kind"], str(r["seed"]), f"{r['used']} / {r['components']}", fmt(r["active_share"], 3),
             f"{fmt(r['auc'], 3)} ({fmt(r['auc_min'], 3)})"] for r in rows]
    return "\n".join([
        "# Against tracr's used components: the score that follows each input's own activity", "",
        f"Command: `{command}`. On the components suite's held-out inputs ({DEFAULTS['tracr']['held_out']} per seed), "
        "the score that follows "
        "each input's own activity exactly (1 for the used components active on the input, 0 for the others) "
        "scored as the suite scores a method: ROC AUC per input against every component the program uses, the "
        "mean and (in brackets) the lowest over the inputs. A used component idle on an input changes nothing "
        "there when closed, as an unused one does. This is a reference line, not a ceiling: a method above it "
        "ranks such idle components above unused ones, by what it carries across inputs.", "",
        table(["program", "kind", "seed", "used / all", "used and active on an input (share)",
               "ROC AUC against the used (mean, min)"], body), ""])


def main(argv: Sequence[str] = ()) -> None:
    args, arguments = tm.study_arguments(
        __doc__.splitlines()[0], DEFAULTS["tracr"]["programs"], argv,
        lambda parser: parser.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULTS["seeds"])))
    torch.set_num_threads(1)
    rows = [row for name in args.programs for kind in args.kinds for row in activity_line(name, kind, args.seeds)]
    print(markdown(rows, "-"))
    write_study_markdown(args.markdown, "benchmarks.studies.component_activity", arguments, lambda command: markdown(rows, command))


if __name__ == "__main__":  # pragma: no cover
    main()
