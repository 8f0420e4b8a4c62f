"""The MiniLM suites' DiffMask: fitted on train sentences, the checkpoint
chosen on train sentences the fit does not see, and the model scored under its
gates."""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn, Tensor

from benchmarks.tasks import sst_bert
from benchmarks.tasks.sst import LABEL_NAMES
from benchmarks.tasks.sst_bert import EncodedSST
from captum_diffmask import CertificateTolerances, certify, Convergence, DiffMask
from captum_diffmask.diffmask import Compute, grouped_options
from captum_diffmask.diffmask.fit.history import epoch_seconds
from captum_diffmask.model.forward import model_device

from benchmarks.common.minilm.fit_cache import mode_settings
from benchmarks.progress import bar


def macro_f1_and_accuracy(predictions: Tensor, labels: Tensor) -> Dict[str, Any]:
    r"""Macro-F1 over the five classes, accuracy and each class's F1 (a list in
    :data:`LABEL_NAMES`' order) of ``predictions``, in percent."""
    per_class = sst_bert.class_f1(predictions, labels, len(LABEL_NAMES))
    return {"macro_f1": 100.0 * float(per_class.mean()),
            "accuracy": 100.0 * float((predictions == labels).float().mean()),
            "class_f1": [100.0 * float(f) for f in per_class]}


class OnDevice:
    r"""Re-iterable batches of tensors moved to ``device``."""

    def __init__(self, batches: Any, device: torch.device) -> None:
        self.batches, self.device = batches, device

    def __iter__(self) -> Any:
        for batch in self.batches:
            yield tuple(t.to(self.device) for t in batch)

    def __len__(self) -> int:
        return len(self.batches)


#: The held-out check of a fit's probe: the deterministic read-out's KL within
#: this many times eps at every layer (the criterion's default tol_kl, 0.25).
HELD_OUT_MARGIN = 1.25
#: The suite's own ``diffmask`` settings, not :meth:`DiffMask.fit`'s.
SUITE_KEYS = ("input", "hidden", "validation_sentences", "validation_from", "select_checkpoint", "certificate")
#: The settings that make the explainer rather than the fit.
INIT_KEYS = ("temperature", "stretch", "probe_hidden_size", "l0", "probe_reads_input", "rerun", "init_bias", "votes")


def fit_arguments(config: Mapping[str, Any], mode: str) -> Tuple[Dict[str, Any], Dict[str, Any], int, bool]:
    r"""The suite's ``diffmask`` settings for ``mode`` (the mode's own win) split
    into the explainer's arguments, :meth:`DiffMask.fit`'s options (ungrouped),
    the batch size and whether a checkpoint is selected."""
    settings = mode_settings(config, mode)
    select = bool(settings.get("select_checkpoint", True))
    options = {k: v for k, v in settings.items() if k not in SUITE_KEYS}
    if not select:
        for key in ("eps_valid", "agreement_valid"):
            options.pop(key, None)
    batch_size = int(options.pop("batch_size", 64))
    init = {k: options.pop(k) for k in list(options) if k in INIT_KEYS}
    return init, options, batch_size, select


def fit_diffmask(
    model: nn.Module, mode: str, train: EncodedSST, valid: EncodedSST, config: Mapping[str, Any], seed: int, verbose: bool,
    checkpoint: Optional[str] = None,
) -> Tuple[DiffMask, Dict[str, Any]]:
    r"""DiffMask in ``mode`` fitted on ``train``; with ``select_checkpoint`` the
    sparsest epoch that keeps the constraint on ``valid`` is restored, else the
    fit's last probe is kept and scored on ``valid`` (``heldout``: per layer the
    deterministic read-out's KL, agreement and kept share). The batches go to
    the model's device; ``checkpoint``: the file the fit's state is written to
    as it goes and resumed from (``DiffMask.fit``'s)."""
    init, options, batch_size, select = fit_arguments(config, mode)
    last_rate = options.pop("lr_lambda_last", None)
    torch.manual_seed(seed)
    explainer = DiffMask(model, mode=mode, **init)
    rate = options.get("lr_lambda", 1.0)
    if last_rate is not None and isinstance(rate, (int, float)):
        # one rate per layer, layer 0 first; a list given as lr_lambda wins
        options["lr_lambda"] = [float(rate)] * explainer.num_layers + [float(last_rate)]
    criterion = options.pop("convergence", None)
    if criterion is not None:
        options["convergence"] = Convergence(**criterion)
    start = time.perf_counter()
    device = model_device(model)
    held_out = OnDevice(valid.loader(128, shuffle=False, sort_by_length=True), device)
    # the orders from torch's RNG, which the fit seeds with ``seed`` and a resumed
    # fit restores: a fit resumed or gone on with from its state is an uninterrupted one
    history = explainer.fit(
        OnDevice(train.loader(batch_size, shuffle=True, seed=None, sort_by_length=True), device),
        validation=held_out if select else None, seed=seed, verbose=verbose,
        **grouped_options(options), **({} if checkpoint is None else {"checkpoint": checkpoint}),
    )
    seconds = time.perf_counter() - start
    heldout = None if select else {str(k): v for k, v in explainer.evaluate(held_out).items()}
    train_seconds = list(epoch_seconds(history).values())
    selected = next((h["epoch"] for h in history if h.get("selected")), None)
    return explainer, {
        "history": history, "seconds": seconds, "epoch_seconds": train_seconds,
        "mean_epoch_seconds": statistics.mean(train_seconds), "selected_epoch": selected,
        "steps": max(report["steps"] for report in explainer.convergence.values()),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "heldout": heldout,
        "feasible": (any(h.get("selected") for h in history) and _feasible(history, selected, options)) if select
        else all(v["kl"] <= HELD_OUT_MARGIN * float(options.get("eps", 0.1)) for v in heldout.values()),
        "options": {**init, **options, "batch_size": batch_size, "convergence": criterion},
        "convergence": {str(k): report for k, report in explainer.convergence.items()},
        "layers_per_batch": len(explainer.convergence) if options.get("layers_per_batch", Compute.layers_per_batch) == "all" else 1,
    }


def continuation_arguments(config: Mapping[str, Any], mode: str) -> Tuple[Dict[str, Any], int]:
    r"""The suite's fit options for ``mode`` that a continuation of its fit
    takes over (not the caps, the checkpoint's bounds or the last layer's
    rate), and the batch size."""
    _, options, batch_size, _ = fit_arguments(config, mode)
    # the layers too: a continuation trains the layers the fit trained
    for key in ("lr_lambda_last", "max_steps", "epochs", "eps_valid", "agreement_valid", "layers"):
        options.pop(key, None)
    return options, batch_size


def certify_fit(
    explainer: DiffMask, mode: str, train: EncodedSST, valid: EncodedSST, config: Mapping[str, Any], seed: int,
    verbose: bool, state: Optional[str] = None,
) -> Optional[Dict[str, Any]]:
    r"""The convergence certificate (:func:`captum_diffmask.certify`) of a suite's
    fit, at the suite's ``diffmask.certificate`` tolerances (None: no
    certificate): the probe trained further on the fit's batches with the fit's
    options (from its ``state`` file when given: its optimiser states and data
    order), its drift measured on the held-out train sentences ``valid``."""
    settings = mode_settings(config, mode)
    if not settings.get("certificate"):
        return None
    options, batch_size = continuation_arguments(config, mode)
    device = model_device(explainer.model)
    certificate = certify(
        explainer, OnDevice(train.loader(batch_size, shuffle=True, seed=None, sort_by_length=True), device),
        OnDevice(valid.loader(128, shuffle=False, sort_by_length=True), device),
        CertificateTolerances(**settings["certificate"]), state=state, seed=seed + 1000, verbose=verbose,
        **grouped_options(options),
    )
    return certificate.to_dict()


def _feasible(history: List[Dict[str, Any]], epoch: Optional[int], options: Mapping[str, Any]) -> bool:
    bound = options.get("eps_valid", options.get("eps", 0.1))
    rows = [h for h in history if h["epoch"] == epoch]
    return bool(rows) and all(h["valid_kl"] <= bound and h["valid_agreement"] >= options.get("agreement_valid", 0.0) for h in rows)


def top2_gap(logits: Tensor) -> Tensor:
    r"""(B,) the gap between the two largest class probabilities of (B, C) logits:
    how far each prediction is from a tie."""
    top = torch.softmax(logits.float(), -1).topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def changed_predictions(plain: Tensor, masked: Tensor, gap: Tensor) -> Dict[str, Any]:
    r"""
    The sentences whose prediction the gates change: how many, how near a tie
    they were, and where they go.

    Args:

        plain (Tensor): (N,) the unmasked predictions.
        masked (Tensor): (N,) the predictions under the gates.
        gap (Tensor): (N,) the unmasked top-2 probability gap (:func:`top2_gap`).

    Returns:
        *dict* with ``count``; ``median_top2_gap`` of the changed sentences and
        ``toward_more_predicted``, the percentage of them whose new class the
        unmasked model predicts more often than their old one (both None when
        none changed).
    """
    changed = plain != masked
    count = int(changed.sum())
    if count == 0:
        return {"count": 0, "median_top2_gap": None, "toward_more_predicted": None}
    frequency = torch.bincount(plain, minlength=int(max(plain.max(), masked.max())) + 1)
    toward = frequency[masked[changed]] > frequency[plain[changed]]
    return {"count": count, "median_top2_gap": float(gap[changed].median()),
            "toward_more_predicted": 100.0 * float(toward.float().mean())}


def macro_f1_change_interval(
    plain: Tensor, masked: Tensor, labels: Tensor, resamples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> List[float]:
    r"""
    A percentile bootstrap interval of the macro-F1 change (points) from the
    unmasked predictions to the masked ones: the sentences drawn with
    replacement, the same draw for both (paired), a private generator.

    Args:

        plain (Tensor): (N,) the unmasked predictions.
        masked (Tensor): (N,) the predictions under the gates.
        labels (Tensor): (N,) the gold labels.
        resamples (int, optional): bootstrap draws. Default: 1000
        confidence (float, optional): the interval's coverage. Default: 0.95
        seed (int, optional): seeds the draws. Default: 0

    Returns:
        *list* ``[low, high]`` in macro-F1 points.
    """
    rows = torch.randint(len(labels), (resamples, len(labels)), generator=torch.Generator().manual_seed(seed))
    changes = 100.0 * (sst_bert.class_f1(masked, labels, len(LABEL_NAMES), rows).mean(-1)
                       - sst_bert.class_f1(plain, labels, len(LABEL_NAMES), rows).mean(-1))
    tail = (1.0 - confidence) / 2
    return [float(changes.quantile(tail)), float(changes.quantile(1.0 - tail))]


def faithfulness(
    explainer: DiffMask, data: EncodedSST, batch_size: int, verbose: bool, rule: str = "threshold"
) -> Dict[str, Any]:
    r"""Per layer: macro-F1 / accuracy of the model under DiffMask's deterministic
    gates (``rule``, as :meth:`DiffMask.masked_forward`: ``"threshold"``, the
    suite's, or ``"louizos"``), the share of real positions masked (gate 0), the
    agreement with the unmasked prediction, the changed predictions
    (:func:`changed_predictions`) and the macro-F1 change's bootstrap interval
    (:func:`macro_f1_change_interval`), at each fitted layer (every layer, for the
    suites' fits); unmasked, the median top-2 probability gap beside the scores.
    Batches go to the model's device."""
    device = model_device(explainer.model)
    layers = sorted(explainer.fitted_layers)
    lengths = data.attention_mask.sum(1)
    order = torch.argsort(lengths, stable=True)
    masked_pred = {k: torch.zeros(len(data), dtype=torch.long) for k in layers}
    kept = {k: 0.0 for k in layers}
    plain = torch.zeros(len(data), dtype=torch.long)
    gap = torch.zeros(len(data))
    for start in bar(range(0, len(data), batch_size), verbose, desc=f"faithfulness {explainer.mode}"):
        rows = order[start : start + batch_size]
        longest = int(lengths[rows].max())
        ids, mask = data.input_ids[rows, :longest].to(device), data.attention_mask[rows, :longest].to(device)
        for k in layers:
            gates, masked, original = explainer.masked_forward(ids, (mask,), layer=k, rule=rule)
            masked_pred[k][rows] = masked.argmax(-1).cpu()
            kept[k] += float((gates > 0).float().sum())
        plain[rows] = original.argmax(-1).cpu()  # the unmasked output: the same at every layer
        gap[rows] = top2_gap(original).cpu()
    positions = float(lengths.sum())
    unmasked = {**macro_f1_and_accuracy(plain, data.labels), "median_top2_gap": float(gap.median())}
    per_layer = []
    for k in layers:
        scores = macro_f1_and_accuracy(masked_pred[k], data.labels)
        per_layer.append({"layer": k, **scores, "masked_share": 100.0 * (1.0 - kept[k] / positions),
                          "agreement": 100.0 * float((masked_pred[k] == plain).float().mean()),
                          "changed": changed_predictions(plain, masked_pred[k], gap),
                          "f1_change_interval": macro_f1_change_interval(plain, masked_pred[k], data.labels)})
    return {"unmasked": unmasked, "per_layer": per_layer}
