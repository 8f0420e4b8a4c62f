"""The squad suite's speed: attribution time per window against one forward
pass and against Integrated Gradients, and DiffMask's training against an
epoch of fine-tuning."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Tuple

import torch
from torch import Tensor

from captum_diffmask.model.forward import model_device
from captum_diffmask.methods import IntegratedGradients

from benchmarks.methods import AUTHORS_OPTIONS
from benchmarks.progress import bar
from benchmarks.records import median_seconds, synchronize
from benchmarks.common.minilm.fitting import OnDevice
from benchmarks.suites.squad.loading import Bench


def measure_speed(config: Mapping[str, Any], bench: Bench, explainers: Mapping[str, Any],
                  fits: Mapping[str, Mapping[str, Any]], verbose: bool) -> Dict[str, Any]:
    r"""
    The results' ``speed``: seconds per window of a forward pass, of DiffMask's
    attribution at every layer (each mode) and of IG at the input, on the
    first ``speed.windows`` analysed windows; their ratios; DiffMask's training
    against a fine-tuning epoch.

    Args:

        config (Mapping): the suite's configuration (``speed``).
        bench (Bench): the model and the windows.
        explainers (Mapping): the fitted DiffMask per mode.
        fits (Mapping): per mode the fit's record (seconds, window steps).
        verbose (bool): a progress bar.

    Returns:
        *dict*.
    """
    options = config.get("speed", {})
    n = min(int(options.get("windows", 16)), len(bench.windows))
    device = model_device(bench.model)
    batches = list(OnDevice(bench.windows.subset(list(range(n))).loader(int(options.get("batch_size", 8))), device))
    ig_steps = int(options.get("ig_steps", 50))
    ig = IntegratedGradients(bench.model, **AUTHORS_OPTIONS["IntegratedGradients"])
    timed: Dict[str, Callable[[Tensor, Tensor, Tensor], Any]] = {
        f"DiffMask {mode}": (lambda ids, mask, types, e=e: e.attribute(ids, additional_forward_args=(mask, types), layer=None))
        for mode, e in explainers.items()}
    timed[f"IntegratedGradients ({ig_steps} steps, input)"] = (
        lambda ids, mask, types: ig.attribute(ids, additional_forward_args=(mask, types), layer=0, n_steps=ig_steps))
    per_window = _seconds_per_window(bench, batches, n, timed, verbose)
    ig_key = f"IntegratedGradients ({ig_steps} steps, input)"
    return {"windows": n, "mean_tokens": float(bench.windows.attention_mask[:n].sum(1).float().mean()),
            "batch_size": int(options.get("batch_size", 8)), "per_window_seconds": per_window,
            "ratio_to_forward": {k: v / per_window["forward"] for k, v in per_window.items()},
            "ig_over_diffmask": {mode: per_window[ig_key] / per_window[f"DiffMask {mode}"] for mode in explainers},
            "training": _training(bench, fits)}


def _seconds_per_window(bench: Bench, batches: List[Tuple[Tensor, Tensor, Tensor]], n: int,
                        timed: Mapping[str, Callable[[Tensor, Tensor, Tensor], Any]], verbose: bool) -> Dict[str, float]:
    r"""Seconds per window of one forward pass (``"forward"``) and of every
    ``timed`` call over the ``n`` windows of ``batches`` (medians of repeats)."""

    def forward() -> None:
        with torch.no_grad():
            for ids, mask, types in batches:
                bench.model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        synchronize(ids.device)

    seconds, _ = median_seconds(forward, repeats=5, budget_seconds=10.0)
    per_window = {"forward": seconds / n}
    for label, fn in bar(list(timed.items()), verbose, desc="speed"):
        def run_all(fn: Callable[[Tensor, Tensor, Tensor], Any] = fn) -> None:
            for ids, mask, types in batches:
                fn(ids, mask, types)
            synchronize(ids.device)
        # IG is timed once without a warm-up call: it is the costliest by far
        slow = label.startswith("IntegratedGradients")
        seconds, _ = median_seconds(run_all, repeats=1 if slow else 3, budget_seconds=5.0, warmup=not slow)
        per_window[label] = seconds / n
    return per_window


def _training(bench: Bench, fits: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    r"""DiffMask's training seconds per window seen, per mode, and an epoch over
    the fine-tuning windows at that rate against a fine-tuning epoch (as timed
    when the model was fine-tuned; NaN without its history)."""
    history = bench.model_info.get("history") or []
    finetune_epoch = float(history[0]["seconds"]) if history else math.nan
    windows = int(bench.model_info.get("windows", 0))
    result: Dict[str, Any] = {"finetune_epoch_seconds": finetune_epoch, "finetune_windows": windows}
    for mode, fit in fits.items():
        per_window = sum(fit["epoch_seconds"]) / max(fit["window_steps"], 1)  # training, validation left out
        result[mode] = {"seconds_per_window": per_window, "epoch_seconds": per_window * windows,
                        "ratio_to_finetune_epoch": per_window * windows / finetune_epoch}
    return result
