"""The sst suite's speed: attribution time per sentence against one forward
pass, a DiffMask training epoch against a fine-tuning epoch, and a fit step with
the layers' masked passes stacked against one pass per layer."""

from __future__ import annotations

import copy
import math
import statistics
import time
import warnings
from typing import Any, Callable, Dict, List, Mapping, Tuple

import torch
from torch import nn, Tensor

from benchmarks.tasks.sst_bert import EncodedSST
from captum_diffmask import DiffMask
from captum_diffmask.diffmask import grouped_options

from benchmarks.progress import bar
from benchmarks.records import median_seconds
from benchmarks.common.minilm.attributions import attribute_at
from benchmarks.common.minilm.fit_cache import mode_settings
from benchmarks.common.minilm.loading import Bench


def time_finetune_steps(model: nn.Module, data: EncodedSST, batch_size: int, batches: int, seed: int) -> float:
    r"""Seconds per sentence of fine-tuning (forward, backward, AdamW step, train
    mode) on a copy of the model, over ``batches`` length-bucketed batches."""
    clone = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(clone.parameters(), lr=1e-5)
    loader = data.batches(batch_size, shuffle=True, seed=seed, with_labels=True, sort_by_length=True)
    seen, spent = 0, 0.0
    for i, (ids, mask, labels) in enumerate(loader):
        if i > batches:
            break
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(clone(input_ids=ids, attention_mask=mask).logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i > 0:  # the first step warms the allocator up
            spent += time.perf_counter() - start
            seen += ids.shape[0]
    return spent / max(seen, 1)


def measure_speed(
    config: Mapping[str, Any], bench: Bench, explainers: Mapping[str, Any], prepared: Mapping[str, Any],
    diffmask: Mapping[str, Any], seed: int, verbose: bool,
) -> Dict[str, Any]:
    r"""
    The results' ``speed``: seconds per sentence of a forward pass and of every
    method's attribution on the first ``speed.sentences`` evaluated sentences,
    their ratios, and DiffMask's training epoch against a fine-tuning epoch.

    Args:

        config (Mapping): the suite's configuration (``speed``, ``diffmask``).
        bench (Bench): the model and the sentences.
        explainers (Mapping): DiffMask per mode (the first seed's).
        prepared (Mapping): the comparison methods that were set up.
        diffmask (Mapping): the results' ``diffmask`` (the fits' epoch times).
        seed (int): the fine-tuning steps' batch order.
        verbose (bool): a progress bar.

    Returns:
        *dict*.
    """
    options = config.get("speed", {})
    data, train = bench.evaluated, bench.train
    n = min(int(options.get("sentences", 64)), len(data))
    batches = list(data.subset(torch.arange(n)).batches(int(options.get("batch_size", 32)), sort_by_length=True))
    ig_steps = int(options.get("ig_steps", 50))
    timed = _timed_methods(explainers, prepared, ig_steps, bench.layers)
    per_sentence = seconds_per_sentence(bench.model, batches, n, timed, verbose)
    ratios = {k: v / per_sentence["forward"] for k, v in per_sentence.items()}
    finetune = time_finetune_steps(bench.model, train, int(config["diffmask"].get("batch_size", 64)),
                                   int(options.get("finetune_batches", 12)), seed)
    finetune_epoch = finetune * len(train)
    ig_key = f"IntegratedGradients ({ig_steps} steps, input)"
    steps = int(options.get("fit_steps", 8))
    return {
        "fit_steps": {mode: fit_step_seconds(bench.model, train, config, mode, steps, seed, int(options.get("fit_rounds", 2)))
                      for mode in explainers} if steps else {},
        "sentences": n, "batch_size": int(options.get("batch_size", 32)), "per_sentence_seconds": per_sentence,
        "ratio_to_forward": ratios, "finetune_epoch_seconds_estimate": finetune_epoch,
        "finetune_seconds_per_sentence": finetune, "training": _training(diffmask, finetune_epoch),
        "diffmask_vs_ig": {mode: per_sentence[ig_key] / per_sentence[f"DiffMask {mode}"]
                           for mode in explainers if ig_key in per_sentence},
    }


#: The ``stack_layers`` choices a fit step is timed with, per mode: the default
#: first, then the choice it is measured against.
STACK_CHOICES = {"input": ("same_site", "none"), "hidden": ("none", "all")}


def fit_step_seconds(
    model: nn.Module, train: EncodedSST, config: Mapping[str, Any], mode: str, steps: int, seed: int, rounds: int = 2,
) -> Dict[str, float]:
    r"""
    Seconds per DiffMask fit step in ``mode`` with each of
    :data:`STACK_CHOICES` (``stack_layers``: the layers' masked passes stacked
    into one, or not): fresh fits of ``steps`` steps on the same batches with
    the suite's settings, in this process (its threads), after a two-step fit
    that builds the first batches' kernels; ``rounds`` rounds, the choices'
    order alternating, the least time of each choice kept (the round least
    disturbed by other processes).

    Returns:
        *dict* ``stack_layers -> seconds per step``.
    """
    settings = mode_settings(config, mode)
    batch_size = int(settings.get("batch_size", 64))
    batches = list(train.batches(batch_size, shuffle=True, seed=seed, sort_by_length=True))[:steps]
    options = {"eps": float(settings.get("eps", 0.1)), "precision": settings.get("precision", "float32"),
               "seed": seed, "verbose": False, "until_converged": False}

    def fit(stack: str, count: int) -> float:
        explainer = DiffMask(model, mode=mode, l0=settings.get("l0", "expected"))
        start = time.perf_counter()
        with warnings.catch_warnings():  # a fit of a few steps has no verdict, and says so
            warnings.simplefilter("ignore")
            explainer.fit(batches[:count], max_steps=count, **grouped_options({**options, "stack_layers": stack}))
        return time.perf_counter() - start

    choices = STACK_CHOICES[mode]
    fit(choices[0], 2)
    seconds: Dict[str, List[float]] = {stack: [] for stack in choices}
    for round_ in range(max(1, rounds)):
        for stack in (choices if round_ % 2 == 0 else choices[::-1]):
            seconds[stack].append(fit(stack, len(batches)) / len(batches))
    return {stack: min(values) for stack, values in seconds.items()}


def _timed_methods(
    explainers: Mapping[str, Any], prepared: Mapping[str, Any], ig_steps: int, last_layer: int,
) -> Dict[str, Callable[[Tensor, Tensor], Any]]:
    r"""What is timed, by its label in the report: DiffMask at every layer at
    once, the other methods at the input (IG with ``ig_steps``; a method fitted
    for one layer only, as the Readout Bottleneck's network for the last, at
    that layer), attention."""
    timed: Dict[str, Callable[[Tensor, Tensor], Any]] = {}
    for mode, explainer in explainers.items():
        timed[f"DiffMask {mode}"] = lambda ids, mask, e=explainer: e.attribute(ids, additional_forward_args=(mask,), layer=None)
    for name, method in prepared.items():
        if name == "Random":
            continue
        if name == "IntegratedGradients":
            timed[f"IntegratedGradients ({ig_steps} steps, input)"] = (
                lambda ids, mask, m=method: m.explainer.attribute(ids, additional_forward_args=(mask,), layer=0, n_steps=ig_steps))
        elif method.explainer.attributes_every_layer():  # one call gives every layer (attention)
            timed[name] = lambda ids, mask, m=method: m.attribute(ids, (mask,), None)
        else:
            layer = 0 if method.explainer.is_prepared(0) else last_layer
            label = "input" if layer == 0 else f"layer {layer}"
            timed[f"{name} ({label})"] = lambda ids, mask, m=method, k=layer: attribute_at(m, ids, mask, k)
    return timed


def seconds_per_sentence(
    model: nn.Module, batches: List[Tuple[Tensor, ...]], n: int, timed: Mapping[str, Callable[[Tensor, Tensor], Any]],
    verbose: bool,
) -> Dict[str, float]:
    r"""Seconds per sentence of one forward pass (``"forward"``) and of every
    ``timed`` call over the ``n`` sentences of ``batches`` (medians of repeats)."""

    def forward() -> None:
        with torch.no_grad():
            for ids, mask in batches:
                model(input_ids=ids, attention_mask=mask)

    forward_seconds, _ = median_seconds(forward, repeats=5, budget_seconds=10.0)
    per_sentence = {"forward": forward_seconds / n}
    for label, fn in bar(list(timed.items()), verbose, desc="speed"):
        def run_all(fn: Callable[[Tensor, Tensor], Any] = fn) -> None:
            for ids, mask in batches:
                fn(ids, mask)
        seconds, _ = median_seconds(run_all, repeats=3, budget_seconds=5.0, warmup=True)
        per_sentence[label] = seconds / n
    return per_sentence


def _training(diffmask: Mapping[str, Any], finetune_epoch: float) -> Dict[str, Dict[str, float]]:
    r"""Per mode: DiffMask's mean training epoch over the seeds, the layers it
    trained per batch, and the ratio to one fine-tuning epoch of an epoch that
    trains one layer per batch (the paper's epoch: the epoch's time divided by
    the layers per batch)."""
    training = {}
    for mode in ("input", "hidden"):
        runs = diffmask.get(mode, {}).get("runs", [])
        epoch = statistics.mean(r["mean_epoch_seconds"] for r in runs) if runs else math.nan
        per_batch = int(runs[0].get("layers_per_batch", 1)) if runs else 1
        training[mode] = {"epoch_seconds": epoch, "layers_per_batch": per_batch,
                          "ratio_to_finetune_epoch": epoch / per_batch / finetune_epoch}
    return training
