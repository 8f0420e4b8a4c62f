r"""
A DiffMask fit step with the layers' masked passes stacked into one pass
(``stack_layers``) against one pass per layer, on the sst suite's MiniLM.

The sst suite times this in its speed section at the end of a full run; this
study is the same measurement alone (the suite's
:func:`benchmarks.suites.sst.speed.fit_step_seconds`), so that it can be run on
an otherwise idle machine in a few minutes, with more steps and rounds. The
machine's load average is recorded before and after: other processes count in
the times.

Usage::

    python -m benchmarks study stacking-speed --markdown docs/results/stacking-speed.md [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

import torch

from benchmarks.common.minilm.loading import load_bench
from benchmarks.common.sst_timing import run_study
from benchmarks.report import fmt_ratio, fmt_seconds, table
from benchmarks.suites.sst import fit_step_seconds, STACK_CHOICES

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "a fit step with the layers' masked passes stacked against one pass per layer (sst suite's MiniLM)"


def measure(config: Mapping[str, Any], steps: int, rounds: int, verbose: bool = False) -> Dict[str, Any]:
    r"""
    Seconds per fit step with each ``stack_layers`` choice, per mode.

    Args:

        config (Mapping): the sst suite's configuration (its model, sentences
                    and DiffMask settings).
        steps (int): steps (batches) a timed fit runs.
        rounds (int): timed fits per choice, the order alternating; the least
                    time is kept.
        verbose (bool): the model's line. Default: False

    Returns:
        *dict* with ``seconds`` (mode -> choice -> seconds a step), the
        ``steps``, ``rounds``, ``batch_size``, ``precision``, ``threads`` and
        the ``load_average`` before and after.
    """
    bench = load_bench(config, verbose)
    before = os.getloadavg()
    seconds = {mode: fit_step_seconds(bench.model, bench.train, config, mode, steps, 0, rounds) for mode in STACK_CHOICES}
    return {"seconds": seconds, "steps": steps, "rounds": rounds, "batch_size": config["diffmask"].get("batch_size"),
            "precision": config["diffmask"].get("precision", "float32"), "threads": torch.get_num_threads(),
            "load_average": {"before": list(before), "after": list(os.getloadavg())}}


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""The measurement as a report: per mode, the default choice's step, the
    other's and their ratio."""
    rows = []
    for mode, seconds in result["seconds"].items():
        default, other = STACK_CHOICES[mode]
        rows.append([mode, f"{fmt_seconds(seconds[default])} (`{default}`)", f"{fmt_seconds(seconds[other])} (`{other}`)",
                     fmt_ratio(seconds[other] / seconds[default])])
    load = result["load_average"]
    return "\n".join([
        "# A fit step with the layers' masked passes stacked, against one pass per layer", "",
        f"Command: `{command}`. The sst suite's fine-tuned MiniLM and DiffMask settings (batches of "
        f"{result['batch_size']} SST train sentences, {result['precision']} passes, every layer trained each step), "
        f"{result['threads']} torch thread(s); fresh fits of {result['steps']} steps on the same batches, "
        f"{result['rounds']} rounds with the order alternating, the least time of each kept. Load average (1, 5, 15 "
        f"min) {', '.join(f'{v:.2f}' for v in load['before'])} before and "
        f"{', '.join(f'{v:.2f}' for v in load['after'])} after.", "",
        table(["mode", "a step (default)", "a step (other)", "other / default"], rows), "",
        "`same_site` runs input mode's seven masked passes (every depth masks the input) as one pass over the batch "
        "repeated; hidden mode's sites differ, so its default is one pass per layer, and `all` stacks them from the "
        "shallowest replaced site, re-running the blocks before each deeper layer's site. Both compute the same "
        "masks and divergences (`tests/library/test_stacking.py`).", ""])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study stacking-speed",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--markdown", required=True, help="where the report is written (its JSON beside it)")
    parser.add_argument("--steps", type=int, default=20, help="steps a timed fit runs (default: 20)")
    parser.add_argument("--rounds", type=int, default=3, help="timed fits per choice (default: 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--set", dest="overrides", default="{}", help="JSON merged into the sst suite's configuration")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    return run_study("benchmarks.studies.stacking_speed", argv, args.markdown, args.threads, args.overrides,
                     lambda config: measure(config, args.steps, args.rounds), markdown)


if __name__ == "__main__":
    sys.exit(main())
