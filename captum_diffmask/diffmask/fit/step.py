"""One training step of a fit: the Lagrangian of each trained layer with freshly
sampled gates, one descent step of the probe on their sum, one move of the
multipliers.

For each layer k of the step, sharing the batch's capture pass: gates sampled
from the probe, a pass with the site replaced by ``z * h + (1 - z) * b`` (the
layers that replace the same site in one stacked pass), and
``L0 + lambda_k * (mean KL - eps)``. Beside it, without gradients, the KL under
the deterministic gates ``attribute`` deploys (when the constraint holds it) and,
for a layer whose gates are all open, the KL with the positions the probe ranks
least needed closed (the closure that tells ``needed`` from ``open``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.multiplier_rules import MultiplierRule
from captum_diffmask.diffmask.fit.distributed import (
    all_sum, any_rank, average_gradients, global_batch_sizes, is_distributed, rank_and_world, shared_uniform,
)
from captum_diffmask.diffmask.fit.fittable import Fittable
from captum_diffmask.diffmask.fit.options import FitOptions
from captum_diffmask.diffmask.sparsity import l0_penalty, score_function_term
from captum_diffmask.diffmask.stacking import masked_logits
from captum_diffmask.model.arguments import PreparedCall
from captum_diffmask.model.divergences import example_kl, log_probs, same_prediction


@dataclass
class StepPlan:
    r"""
    What one training step needs besides its batch.

    Attributes:
        options (FitOptions): the fit's options.
        constraint (KLConstraint): the fit's constraint.
        probe_optimizer (torch.optim.Optimizer, optional): the probe's optimiser
                    (a step's :func:`lagrangian` alone needs none).
        multipliers (MultiplierRule, optional): the rule that moves the multipliers.
        step (int): the step's number, from 1 (for errors).
        open_share (float): the kept share counted as "all open"; the closure
                    closes the other ``1 - open_share`` of a layer's positions.
        closure_layers (set of int): the layers whose gates are all open: their
                    closure is measured.
        deployed (dict, optional): layer -> the deterministic gates' KL to hold
                    this step instead of measuring it (a layer not in it is
                    measured); None: every layer measured.
    """

    options: FitOptions
    constraint: KLConstraint
    probe_optimizer: Optional[torch.optim.Optimizer] = None
    multipliers: Optional[MultiplierRule] = None
    step: int = 1
    open_share: float = 0.95
    closure_layers: Set[int] = None  # type: ignore[assignment]
    deployed: Optional[Mapping[int, float]] = None

    def __post_init__(self) -> None:
        self.closure_layers = set(self.closure_layers or ())


def training_step(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], original: Tensor, layers: Sequence[int],
    plan: StepPlan,
) -> Dict[int, Dict[str, float]]:
    r"""
    One optimiser step on the sum of the Lagrangians of ``layers``, then one
    move of the multipliers.

    Args:

        explainer (Fittable): the explainer whose probe is trained.
        call (PreparedCall): the batch.
        states (dict): site name -> (B, T, H), from the batch's capture pass.
        original (Tensor): (B, C) (or (B, K, C)) logits of the unmasked model.
        layers (sequence of int): the layers trained on the batch.
        plan (StepPlan): the rest of what the step needs.

    Returns:
        *dict* layer -> the step's record: mean ``kl``, expected kept share
        ``l0`` and ``agreement`` (over every process's batch), the
        ``constraint`` value the multiplier held, ``kl_deployed`` and
        ``closure`` where measured.
    """
    assert explainer.probe is not None and explainer.lambdas is not None
    probe_opt, multipliers = plan.probe_optimizer, plan.multipliers
    assert probe_opt is not None and multipliers is not None
    probe_opt.zero_grad(set_to_none=True)
    multipliers.zero_grad()
    rank, world = rank_and_world()
    sizes = global_batch_sizes(call.ids.shape[0], call.ids.device)
    records: Dict[int, Dict[str, float]] = {}
    for group in explainer.gates.pass_groups(layers, plan.options.compute.stack_layers):
        # one backward per masked pass: only that pass's graph is held in memory
        loss, group_records = lagrangian(explainer, call, states, original, group, sizes, plan)
        loss.backward()
        records.update(group_records)
    if world > 1:  # the gradient of the global batch's mean loss, on every rank
        average_gradients([*explainer.probe.parameters(), explainer.lambdas.values], sizes[rank] / sum(sizes))
    probe_opt.step()
    multipliers.step({k: record["constraint"] for k, record in records.items()})
    return records


def lagrangian(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], original: Tensor, layers: Sequence[int],
    sizes: Sequence[int], plan: StepPlan,
) -> Tuple[Tensor, Dict[int, Dict[str, float]]]:
    r"""The sum over ``layers`` of ``L0 + lambda_k * (mean KL - eps)`` with freshly
    sampled gates, their masked passes run as one (``sizes``: every process's
    batch size), and each layer's record of the step."""
    assert explainer.probe is not None and explainer.lambdas is not None
    rank, world = rank_and_world()
    recipe, precision = plan.options.optimization, plan.options.compute.precision
    noise = (lambda shape: shared_uniform(shape, sizes, rank, call.ids.device)) if world > 1 else None
    logits = explainer.gates.logits_of_layers(states, layers, call.mask)  # one probe call for the group
    samples = {k: explainer.gates.sample_with_plain(states, k, recipe.vote_sampling, noise, call.mask,
                                                   float(recipe.l0_floor), logits[k]) for k in layers}
    masked = _masked_logits(explainer, call, states, {k: sample[0] for k, sample in samples.items()}, precision)
    log_p = log_probs(original)
    total, records = torch.zeros((), device=original.device), {}
    for k, (gates, log_keep, plain) in samples.items():
        loss, records[k] = _layer_loss(explainer, call, log_p, masked[k], gates, log_keep, plain, k, plan)
        _check_finite(plan.step, k, {"the model's logits": original, "the masked logits": masked[k],
                                         "the gates": gates, "the loss": loss})
        total = total + loss
    for k in layers:
        if k in plan.closure_layers:
            records[k]["closure"] = _closure_kl(explainer, call, states, log_p, samples[k][1], k, plan.open_share,
                                                precision)
    if plan.constraint.needs_deployed_kl:
        held = {k: plan.deployed[k] for k in layers if k in (plan.deployed or {})}
        measured = {k: samples[k][1].detach() > math.log(0.5) for k in layers if k not in held}
        deployed = {**held, **(_mean_kls_with_gates(explainer, call, states, log_p, measured, precision)
                               if measured else {})}
        for k in layers:
            records[k]["kl_deployed"] = deployed[k]
            records[k]["constraint"] = plan.constraint.value(records[k]["kl"], deployed[k])
    return total, records


def _masked_logits(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], gates: Mapping[int, Tensor], precision: str,
    baseline: Optional[Callable[[int], Tensor]] = None,
) -> Dict[int, Tensor]:
    r""":func:`~captum_diffmask.diffmask.stacking.masked_logits` with the model's passes in ``precision``."""
    with model_precision(precision, call.ids.device):
        return masked_logits(explainer.gates, explainer.replaced_logits, call, states, gates, baseline)


def _layer_loss(
    explainer: Fittable, call: PreparedCall, log_p: Tensor, masked: Tensor, gates: Tensor, log_keep: Tensor,
    plain: Tensor, layer: int, plan: StepPlan,
) -> Tuple[Tensor, Dict[str, float]]:
    r"""``L0 + lambda_k * (mean KL - eps)`` of one layer from its masked logits,
    and the step's record of that layer."""
    assert explainer.lambdas is not None
    log_q = log_probs(masked)
    kl = example_kl(log_p, log_q)
    real = explainer.gates.positions(call.mask, layer)
    penalty = l0_penalty(log_keep, real, explainer.l0)
    lam, violation = explainer.lambdas(layer), plan.constraint.violation(kl.mean())
    if plan.options.optimization.score_gradient:  # 0 in value: the multiplier sees the same violation
        violation = violation + score_function_term(kl, gates, plain, real)
    loss = penalty.mean() + lam * violation
    record = _step_record(kl, log_keep, log_p, log_q, real)
    record["constraint"] = record["kl"]
    return loss, record


def _closure_kl(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], log_p: Tensor, log_keep: Tensor,
    layer: int, open_share: float, precision: str,
) -> float:
    r"""The mean KL with every gate open but those of the ``1 - open_share``
    share of the batch's real gates (positions, or components) that the probe
    ranks least needed (lowest P(z != 0); at least one), which are closed: can a
    layer whose gates are all open close any of them?"""
    real = explainer.gates.positions(call.mask, layer).bool()
    scores = log_keep.detach().masked_fill(~real, float("inf")).flatten()
    count = max(1, math.ceil((1.0 - open_share) * int(real.sum())))
    keep = torch.ones_like(scores, dtype=torch.bool)
    keep[torch.topk(scores, count, largest=False).indices] = False
    return _mean_kls_with_gates(explainer, call, states, log_p, {layer: keep.view_as(real)}, precision)[layer]


def _mean_kls_with_gates(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], log_p: Tensor, keep: Mapping[int, Tensor],
    precision: str,
) -> Dict[int, float]:
    r"""Per layer, the batch's mean KL(original || masked) with binary gates
    ``keep`` (layer -> (B, T) or (B, count)), without gradients, over every
    process's batch; the layers' passes run as one."""
    with torch.no_grad():
        # a layer whose gates are all open is the model itself (a fit's first
        # hundreds of steps, and layers that keep everything): no pass needed
        closing = {k: g for k, g in keep.items() if not bool(g.all())}
        read_out = explainer.gates
        masked = _masked_logits(explainer, call, states, {k: g.float() for k, g in closing.items()}, precision,
                                baseline=lambda k: read_out.masked_site(k)[1].detach()) if closing else {}
        kls = {k: example_kl(log_p, log_probs(masked[k])) if k in masked else torch.zeros(log_p.shape[0], device=log_p.device)
               for k in keep}
    if not is_distributed():
        return {k: float(kl.mean()) for k, kl in kls.items()}
    # every layer's sum in one collective: the batch size is the same for all of them
    totals = all_sum(torch.stack([kl.sum() for kl in kls.values()] + [torch.tensor(float(log_p.shape[0]), device=log_p.device)])
                     .float().cpu()).tolist()
    return {k: total / totals[-1] for k, total in zip(kls, totals[:-1])}


def _step_record(kl: Tensor, log_keep: Tensor, log_p: Tensor, log_q: Tensor, mask: Tensor) -> Dict[str, float]:
    r"""The step's mean KL, expected kept share and agreement, summed over the
    processes' batches before the division."""
    real = mask.float()
    if not is_distributed():  # the figures as a single process has always computed them
        with torch.no_grad():
            kept = (log_keep.exp() * real).sum() / real.sum().clamp(min=1.0)
            agreement = same_prediction(log_p, log_q).float().mean()
        return {"kl": float(kl.detach().mean()), "l0": float(kept), "agreement": float(agreement)}
    with torch.no_grad():
        sums = torch.stack([
            kl.detach().sum(), (log_keep.exp() * real).sum(), real.sum(),
            same_prediction(log_p, log_q).float().sum(), torch.tensor(float(kl.shape[0]), device=kl.device),
        ]).float().cpu()
    total_kl, kept, positions, agree, examples = all_sum(sums).tolist()
    return {"kl": total_kl / examples, "l0": kept / max(positions, 1.0), "agreement": agree / examples}


def _check_finite(step: int, layer: int, values: Mapping[str, Tensor]) -> None:
    r"""Stops the fit at the first non-finite value, naming the step, the layer
    and what went non-finite (a fit would otherwise go on, NaN in every record)."""
    bad = [what for what, value in values.items() if not bool(torch.isfinite(value.detach()).all())]
    if any_rank(bool(bad)):  # every process stops together, none waits for the others
        what = bad[0] if bad else "a value on another process"
        raise FloatingPointError(
            f"DiffMask.fit: {what} became non-finite at step {step} (layer {layer}); check the model "
            "for NaN or inf weights or inputs, or lower lr"
        )


def model_precision(precision: str, device: torch.device) -> ContextManager[Any]:
    r"""The context the analysed model's passes of a fit run in: nothing for
    ``"float32"``, bfloat16 autocast on ``device`` for ``"bfloat16"``."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

