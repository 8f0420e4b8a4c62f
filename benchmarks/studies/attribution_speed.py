r"""
DiffMask's attribution at every layer against one forward pass, on the sst
suite's MiniLM, with input mode's votes evaluated on one copy of each layer's
features (the default) and, as the reference in the same run, on one copy per
vote network (how every network read its features before); and an input-mode
fit step both ways.

The sst suite times attribution in its speed section at the end of a full run,
with the fits of that run; the probe's cost does not depend on its trained
weights, so this study times a probe built by a two-step fit, on the same
sentences, batches and threads as the suite's speed section
(:func:`benchmarks.suites.sst.speed.seconds_per_sentence`), in a few minutes. The
machine's load average is recorded before and after: other processes count in
the times.

Usage::

    python -m benchmarks study attribution-speed --markdown docs/results/attribution-speed.md [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional
from unittest import mock

import torch
from torch import Tensor

from benchmarks.common.minilm.fit_cache import mode_settings
from benchmarks.common.minilm.loading import load_bench
from benchmarks.common.sst_timing import run_study
from benchmarks.report import fmt_ratio, fmt_seconds, table
from benchmarks.suites.sst import ATTRIBUTION_RATIO_MAX, fit_step_seconds, seconds_per_sentence, STACK_CHOICES
from captum_diffmask import DiffMask
from captum_diffmask.diffmask.gate_networks import GateNetworks

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "DiffMask's attribution at every layer against one forward pass, the votes sharing their features or not (sst suite's MiniLM)"

#: The label of the reference: input mode's votes each on a copy of their own.
ONE_COPY_PER_VOTE = "DiffMask input, one copy per vote"


@contextmanager
def one_copy_per_network() -> Iterator[None]:
    r"""Every gate network evaluated on its own standardised copy of its features,
    as before networks reading the same features shared one."""
    singletons = lambda self, features, networks: [[i] for i in range(len(networks))]  # noqa: E731
    with mock.patch.object(GateNetworks, "_shared_feature_groups", singletons):
        yield


def built_explainer(model: torch.nn.Module, train: Any, config: Mapping[str, Any], mode: str) -> DiffMask:
    r"""DiffMask in ``mode`` with the suite's settings and its probe built by a
    two-step fit (the probe's size and cost are a trained one's)."""
    settings = mode_settings(config, mode)
    batches = list(train.batches(int(settings.get("batch_size", 64)), shuffle=True, seed=0, sort_by_length=True))[:2]
    explainer = DiffMask(model, mode=mode, l0=settings.get("l0", "expected"))
    with warnings.catch_warnings():  # a fit of two steps has no verdict, and says so
        warnings.simplefilter("ignore")
        explainer.fit(batches, max_steps=2, eps=float(settings.get("eps", 0.1)), seed=0, verbose=False,
                      convergence={"until_converged": False})
    return explainer


def measure(config: Mapping[str, Any], verbose: bool = False) -> Dict[str, Any]:
    r"""
    Seconds per sentence of one forward pass and of DiffMask's attribution at
    every layer per mode, and input mode's with one copy per vote network.

    Args:

        config (Mapping): the sst suite's configuration (its model, sentences,
                    DiffMask settings and ``speed`` options).
        verbose (bool): the model's line. Default: False

    Returns:
        *dict* with ``per_sentence_seconds`` and ``ratio_to_forward`` (label ->
        value), ``fit_step_seconds`` (:func:`input_fit_steps`), ``sentences``,
        ``batch_size``, ``threads`` and the ``load_average`` before and after.
    """
    bench = load_bench(config, verbose)
    options = config.get("speed", {})
    n = min(int(options.get("sentences", 64)), len(bench.evaluated))
    batch_size = int(options.get("batch_size", 32))
    batches = list(bench.evaluated.subset(torch.arange(n)).batches(batch_size, sort_by_length=True))
    explainers = {mode: built_explainer(bench.model, bench.train, config, mode) for mode in ("input", "hidden")}

    def every_layer(explainer: DiffMask) -> Callable[[Tensor, Tensor], Tensor]:
        return lambda ids, mask: explainer.attribute(ids, additional_forward_args=(mask,), layer=None)

    before = os.getloadavg()
    timed = {f"DiffMask {mode}": every_layer(explainer) for mode, explainer in explainers.items()}
    per_sentence = seconds_per_sentence(bench.model, batches, n, timed, False)
    with one_copy_per_network():
        reference = seconds_per_sentence(bench.model, batches, n, {ONE_COPY_PER_VOTE: timed["DiffMask input"]}, False)
    per_sentence[ONE_COPY_PER_VOTE] = reference[ONE_COPY_PER_VOTE]
    per_sentence["forward (second measurement)"] = reference["forward"]
    return {"per_sentence_seconds": per_sentence, "fit_step_seconds": input_fit_steps(bench, config),
            "ratio_to_forward": {k: v / per_sentence["forward"] for k, v in per_sentence.items()},
            "sentences": n, "batch_size": batch_size, "threads": torch.get_num_threads(),
            "load_average": {"before": list(before), "after": list(os.getloadavg())}}


def input_fit_steps(bench: Any, config: Mapping[str, Any]) -> Dict[str, float]:
    r"""Seconds per input-mode fit step (every layer trained, the default
    stacking) with the votes on one copy of each layer's features and with a copy
    per vote network (the suite's :func:`fit_step_seconds`, ``speed.fit_steps``
    steps, ``speed.fit_rounds`` rounds); empty when ``fit_steps`` is 0."""
    options = config.get("speed", {})
    steps, rounds = int(options.get("fit_steps", 8)), int(options.get("fit_rounds", 2))
    if not steps:
        return {}
    default = STACK_CHOICES["input"][0]
    shared = fit_step_seconds(bench.model, bench.train, config, "input", steps, 0, rounds)[default]
    with one_copy_per_network():
        apart = fit_step_seconds(bench.model, bench.train, config, "input", steps, 0, rounds)[default]
    return {"shared": shared, "one copy per vote": apart, "steps": steps, "rounds": rounds}


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""The measurement as a report: each timing, its ratio to the forward pass,
    and the suite's attribution target judged per mode."""
    seconds, ratios = result["per_sentence_seconds"], result["ratio_to_forward"]
    rows = [[label, fmt_seconds(seconds[label]), fmt_ratio(ratios[label])] for label in seconds]
    most = ATTRIBUTION_RATIO_MAX
    verdicts = [f"- {label}: {ratios[label]:.2f}x one forward pass (target <= {most}x): "
                f"**{'met' if ratios[label] <= most else 'missed'}**"
                for label in ("DiffMask input", "DiffMask hidden", ONE_COPY_PER_VOTE)]
    load = result["load_average"]
    return "\n".join([
        "# DiffMask's attribution at every layer against one forward pass", "",
        f"Command: `{command}`. The sst suite's fine-tuned MiniLM and speed settings: the first "
        f"{result['sentences']} evaluated sentences in batches of {result['batch_size']}, float32, "
        f"{result['threads']} torch thread(s), medians of repeats (the suite's `seconds_per_sentence`); the probes "
        "built by a two-step fit with the suite's DiffMask settings (their cost does not depend on their weights). "
        f"Load average (1, 5, 15 min) {', '.join(f'{v:.2f}' for v in load['before'])} before and "
        f"{', '.join(f'{v:.2f}' for v in load['after'])} after.", "",
        table(["", "seconds per sentence", "x forward"], rows), "",
        "Input mode at every layer evaluates (L + 1)(L + 2) / 2 vote networks, 28 for six blocks, the votes of "
        "every depth k >= j reading the same `[input; hidden.j]`. By default those share one standardised copy of "
        f"the features and one matrix product (`GateNetworks`); \"{ONE_COPY_PER_VOTE}\" is the same attribution "
        "with each network reading a copy of its own, standardised once per network, as before. The forward pass "
        "is timed again beside the reference, to show the machine's drift between the two.", "",
        *_fit_step_lines(result.get("fit_step_seconds") or {}),
        "Targets (the sst suite's attribution target):", "", *verdicts, ""])


def _fit_step_lines(steps: Mapping[str, float]) -> List[str]:
    if not steps:
        return []
    return [f"A fit step in input mode (every layer trained on the batch, `{STACK_CHOICES['input'][0]}` stacking; "
            f"fresh fits of {steps['steps']} steps, {steps['rounds']} rounds, the least time kept): "
            f"{fmt_seconds(steps['shared'])} with the votes on one copy of each layer's features, "
            f"{fmt_seconds(steps['one copy per vote'])} with a copy per vote network "
            f"({fmt_ratio(steps['one copy per vote'] / steps['shared'])}): the probe is evaluated once per step for "
            "every layer it trains.", ""]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study attribution-speed",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--markdown", required=True, help="where the report is written (its JSON beside it)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--set", dest="overrides", default="{}", help="JSON merged into the sst suite's configuration")
    args = parser.parse_args(argv)
    return run_study("benchmarks.studies.attribution_speed", argv, args.markdown, args.threads, args.overrides,
                     measure, markdown)


if __name__ == "__main__":
    sys.exit(main())
