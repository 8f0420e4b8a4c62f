"""The sst-erasure suite's methods at work: exact erasure (the reference), the
per-example masks, the methods that rank words, and the model run with only a
kept set of words."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.tasks.sst import sst_sites, SSTClassifier, SSTData
from captum_diffmask import DiffMask
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.evaluation.erasure_agreement import agreement_per_example, keeps_prediction
from captum_diffmask.methods import ExactErasure, PerExampleDiffMask, REINFORCE
from captum_diffmask.model.sites import SiteLocator

from benchmarks.methods import MethodContext, prepare, route_options
from benchmarks.progress import bar
from benchmarks.suites.sst_erasure.settings import MASK_METHODS


class MaskedPredictor:
    r"""Runs the model with the input words outside a kept set replaced by the
    baseline, and says whether the prediction survives."""

    def __init__(self, model: SSTClassifier, baseline: Tensor) -> None:
        self.model = model
        self.baseline = baseline
        self.locator = SiteLocator.locate(model, sst_sites(model))

    @torch.no_grad()
    def keeps(self, data: SSTData, kept: Tensor, batch_size: int = 512) -> Tensor:
        r"""(N,) bool: the argmax with only ``kept`` (N, T) words is the original one."""
        out = []
        for start in range(0, len(data), batch_size):
            ids = data.ids[start : start + batch_size]
            mask = data.mask[start : start + batch_size]
            keep = kept[start : start + batch_size, : ids.shape[1]].bool() | ~mask
            original = self.model(ids, mask)
            words = self.model.embedding(ids)
            with self.locator.replace({"input": torch.where(keep.unsqueeze(-1), words, self.baseline.to(words))}):
                masked = self.model(ids, mask)
            out.append(keeps_prediction(original, masked))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)

    def per_sentence(self, data: SSTData, kept: Tensor, optimal_sets: Sequence[Tensor]) -> Dict[str, Tensor]:
        r""":func:`agreement_per_example` of the ``kept`` (N, T) tokens: (N,)
        scores per sentence, sufficiency measured here."""
        return agreement_per_example(kept, optimal_sets, self.keeps(data, kept), data.mask)


def _chunks(n: int, size: int) -> List[Tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _pad_to(tensor: Tensor, length: int) -> Tensor:
    if tensor.shape[1] == length:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(tensor.shape[0], length - tensor.shape[1])], dim=1)


def run_erasure(model: SSTClassifier, data: SSTData, baseline: Tensor, options: Mapping[str, Any], verbose: bool) -> Dict[str, Any]:
    r"""Exact erasure with every minimal solution on all rows of ``data`` (sorted
    by length so that chunks pad little)."""
    options = dict(options)
    chunk = int(options.pop("chunk", 256))
    erasure = ExactErasure(model, sites=sst_sites(model), padding_mask_arg=0, baselines=baseline,
                           verbose=False, **options)
    length = data.ids.shape[1]
    sizes, solved, complete, evaluations, all_masks = [], [], [], [], []
    start_time = time.perf_counter()
    for start, stop in bar(_chunks(len(data), chunk), verbose, desc="exact erasure"):
        part = data.subset(torch.arange(start, stop))
        result = erasure.search(part.ids, (part.mask,), all_solutions=True)
        sizes.append(result.size)
        solved.append(result.solved)
        complete.append(result.complete)
        evaluations.append(result.num_evaluations)
        all_masks.extend(_pad_to(m, length) for m in result.all_masks)
    seconds = time.perf_counter() - start_time
    return {
        "size": torch.cat(sizes), "solved": torch.cat(solved), "complete": torch.cat(complete),
        "evaluations": torch.cat(evaluations), "all_masks": all_masks, "seconds": seconds,
    }


def fit_amortised_diffmask(
    model: SSTClassifier, train: SSTData, baseline: Tensor, options: Mapping[str, Any], seed: int, verbose: bool
) -> Tuple[DiffMask, int, Dict[str, Any]]:
    r"""Amortised DiffMask fitted on train, its input baseline pinned to the
    erasure baseline (built on the first batch, then given learning rate 0), so
    that it is scored against the erasure it approximates."""
    options = dict(options)
    batch_size = int(options.pop("batch_size", 64))
    layer = int(options.pop("layer", 1))
    options.setdefault("layers", [layer])
    options.setdefault("seed", seed)
    options.setdefault("verbose", verbose)
    options["lr_baseline"] = 0.0
    routed, ignored = route_options(options, [("init", DiffMask.__init__), ("fit", DiffMask.fit)])
    if ignored:
        raise ValueError(f"method_options.DiffMask: unknown options {ignored}")
    explainer = DiffMask(model, sites=sst_sites(model), padding_mask_arg=0, **routed["init"])
    # the input baseline pinned to the erasure's (input mode; lr_baseline 0 keeps it there)
    pinned = baseline if explainer.mode == "input" else None
    history = explainer.fit(train.loader(batch_size, shuffle=True, seed=seed),
                            **grouped_options({**routed["fit"], "init_baseline": pinned}))
    return explainer, layer, {"fit_last": history[-1] if history else {}, "fit_steps": int(sum(h["steps"] for h in history))}


@dataclass
class MaskRun:
    r"""One run of a per-example mask method over the scored sentences.

    Attributes:
        kept (Tensor): (N, T) bool, the selected deterministic masks.
        keep (Tensor): (N, T) the keep probabilities at the selected step.
        kl (Tensor): (N,) KL(original || masked) of the selected masks, nats.
        step (Tensor): (N,) the step each mask comes from (1-based).
        lambdas (Tensor): (N,) the final multipliers.
        seconds (float): wall time of the whole run.
    """

    kept: Tensor
    keep: Tensor
    kl: Tensor
    step: Tensor
    lambdas: Tensor
    seconds: float


def run_mask_method(
    name: str, model: SSTClassifier, data: SSTData, baseline: Tensor, options: Mapping[str, Any],
    chunk: int, seed: int, verbose: bool,
) -> MaskRun:
    r"""
    Per-example masks (``fit_masks``) of every sentence of ``data``, in chunks
    of ``chunk`` sentences, the global RNG seeded with ``seed`` first.

    Args:

        name (str): a row of :data:`~.settings.MASK_METHODS` (the method it runs).
        model (SSTClassifier): the GRU.
        data (SSTData): the sentences.
        baseline (Tensor): (H,) what erased tokens become.
        options (Mapping): the row's options: the constructor's (``reward``) and
                    ``fit_masks``'s.
        chunk (int): sentences per call.
        seed (int): the run's seed.
        verbose (bool): a progress bar.

    Returns:
        *MaskRun*.
    """
    cls = {"PerExampleDiffMask": PerExampleDiffMask, "REINFORCE": REINFORCE}[MASK_METHODS[name]]
    options = dict(options)
    options.pop("chunk", None)
    routed, ignored = route_options(options, [("init", cls.__init__), ("fit", cls.fit_masks)])
    if ignored:
        raise ValueError(f"method_options.{name}: unknown options {ignored}")
    explainer = cls(model, sites=sst_sites(model), padding_mask_arg=0, **routed["init"])
    parts: Dict[str, List[Tensor]] = {"kept": [], "keep": [], "kl": [], "step": [], "lambdas": []}
    torch.manual_seed(seed)
    start_time = time.perf_counter()
    for start, stop in bar(_chunks(len(data), chunk), verbose, desc=name):
        part = data.subset(torch.arange(start, stop))
        result = explainer.fit_masks(part.ids, (part.mask,), layer=0, baselines=baseline, verbose=False, **routed["fit"])
        parts["kept"].append(_pad_to(result.mask.bool(), data.ids.shape[1]))
        parts["keep"].append(_pad_to(result.keep, data.ids.shape[1]))
        parts["kl"].append(result.kl)
        parts["step"].append(result.step)
        parts["lambdas"].append(result.lambdas)
    seconds = time.perf_counter() - start_time
    return MaskRun(**{key: torch.cat(value) for key, value in parts.items()}, seconds=seconds)


def run_scoring_method(
    name: str, ctx: MethodContext, model: SSTClassifier, train: SSTData, data: SSTData, baseline: Tensor,
    options: Mapping[str, Any], chunk: int, seed: int, verbose: bool,
) -> Tuple[Tensor, float, float, Dict[str, Any]]:
    r"""(N, T) scores of a method that ranks words, seconds to attribute, setup seconds, info."""
    options = dict(options)
    chunk = int(options.pop("chunk", chunk))
    info: Dict[str, Any] = {}
    if name == "DiffMask":
        start_time = time.perf_counter()
        explainer, layer, info = fit_amortised_diffmask(model, train, baseline, options, seed, verbose)
        setup = time.perf_counter() - start_time

        def attribute(ids: Tensor, mask: Tensor) -> Tensor:
            return explainer.attribute(ids, additional_forward_args=(mask,), layer=layer)
    else:
        if name in ("IntegratedGradients", "Occlusion"):
            options["baselines"] = baseline  # the erasure baseline (runtime value, not in the config)
        prepared = prepare(name, ctx, options)
        setup = prepared.setup_seconds

        def attribute(ids: Tensor, mask: Tensor) -> Tensor:
            return prepared.attribute(ids, (mask,), 0)
    torch.manual_seed(seed)
    pieces = []
    start_time = time.perf_counter()
    for start, stop in bar(_chunks(len(data), chunk), verbose, desc=name):
        part = data.subset(torch.arange(start, stop))
        pieces.append(_pad_to(attribute(part.ids, part.mask).float(), data.ids.shape[1]))
    return torch.cat(pieces), time.perf_counter() - start_time, setup, info
