"""A convergence certificate: is a probe the fit called settled an answer, or a
plateau it would leave if trained longer?

The fit's verdict (:class:`~captum_diffmask.diffmask.constrained.convergence.Convergence`)
says that window means stopped moving, and each layer is frozen at its first
settled window. :func:`certify` asks what a reviewer asks: train the probe
further, with nothing frozen and the same options, and measure on held-out
batches how far it moves (the masked share, the keep probabilities, the KL).
A probe counts only when it stays within tolerances fixed before the
measurement (:class:`CertificateTolerances`). Given the fit's state (the file
its ``checkpoint`` wrote), the further steps go on with the fit's own
optimiser and multiplier states, as the fit would have gone on; without it
they start fresh ones, whose first steps move every parameter by about the
learning rate (Adam's normalised step, before its moments have the gradients'
scale): a kick the fit itself never gives, which a certificate then counts as
drift.

The fit's ``"needed"`` verdict (every gate open, because closing the positions
the probe ranks least needed breaks the constraint) trusts the probe's own
ranking. The certificate judges it without the ranking: on held-out examples
every position is closed alone in turn, and each example's cheapest closure is
kept; when even those break the constraint on average, no example can give up
a single position, and every gate open is the answer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from captum_diffmask.diffmask.constrained.convergence import Convergence, SETTLED
from captum_diffmask.diffmask.constrained.multiplier_rules import default_rate
from captum_diffmask.diffmask.fit.fit_state import FitCheckpoint, FitState
from captum_diffmask.diffmask.fit.option_groups import Optimization
from captum_diffmask.diffmask.fit.options import FitOptions
from captum_diffmask.diffmask.stacking import masked_logits
from captum_diffmask.model.divergences import example_kl, log_probs
from captum_diffmask.model.fingerprint import weights_fingerprint
from captum_diffmask.model.forward import Batch, frozen

#: The fit options a continuation does not take over from the fit it continues.
_NOT_CONTINUED = ("validation", "checkpoint", "max_steps", "epochs", "verbose", "layers")


@dataclass(frozen=True)
class CertificateTolerances:
    r"""
    What the certificate allows a settled probe to move, fixed before it is measured.

    Attributes:
        steps (int): the further steps, every trained layer on every batch,
                    nothing frozen. Default: 500 (five of the criterion's windows)
        masked_share (float): the largest change of the held-out masked share
                    (share of real positions whose deterministic gate is
                    closed). Default: 0.02
        keep (float): the largest mean absolute change of the held-out keep
                    probabilities, over real positions. Default: 0.05
        tol_kl (float): the largest change of the held-out mean KL, as a share
                    of eps (the criterion's own tolerance on eps); also the
                    bound ``eps * (1 + tol_kl)`` the certificate reports the
                    held-out KL against. Default: 0.25
        closure_examples (int): the held-out examples on which a ``"needed"``
                    layer's positions are closed one at a time (a pass per
                    position). Default: 32
    """

    steps: int = 500
    masked_share: float = 0.02
    keep: float = 0.05
    tol_kl: float = 0.25
    closure_examples: int = 32

    def __post_init__(self) -> None:
        for name in ("steps", "closure_examples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"tolerances.{name} must be an int >= 1, got {value!r}")
        for name in ("masked_share", "keep", "tol_kl"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"tolerances.{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass
class LayerCertificate:
    r"""
    One layer's certificate.

    Attributes:
        layer (int): the layer.
        verdict (str): the fit's verdict.
        masked_before, masked_after (float): the held-out masked share before
                    and after the further steps.
        keep_change (float): the mean absolute change of the keep probabilities.
        kl_before, kl_after (float): the held-out mean KL (nats), deterministic gates.
        within_bound (bool): whether the certified probe's held-out KL is
                    within ``eps * (1 + tol_kl)`` (reported, not part of
                    ``counted``: it is how the probe generalises, not whether
                    it has settled).
        single_closure_kl (float, optional): for a ``"needed"`` layer, the mean
                    over examples of the KL of each example's cheapest single
                    closure; None otherwise.
        counted (bool): whether the probe counts: a settled verdict, the drift
                    within the tolerances, and for ``"needed"`` the single
                    closures breaking the constraint.
        reasons (list of str): why it does not count (empty when it does).
    """

    layer: int
    verdict: str
    masked_before: float
    masked_after: float
    keep_change: float
    kl_before: float
    kl_after: float
    within_bound: bool = False
    single_closure_kl: Optional[float] = None
    counted: bool = False
    reasons: List[str] = field(default_factory=list)


@dataclass
class Certificate:
    r"""
    What :func:`certify` measured.

    Attributes:
        eps (float): the fit's eps.
        tolerances (CertificateTolerances): the tolerances, fixed before the measurement.
        layers (dict): layer -> :class:`LayerCertificate`.
        continuation (dict): layer -> the continuation's own verdict.
        continued (bool): whether the further steps went on with the fit's
                    optimiser and multiplier states (its ``state`` file);
                    False: with fresh ones.
    """

    eps: float
    tolerances: CertificateTolerances
    layers: Dict[int, LayerCertificate] = field(default_factory=dict)
    continuation: Dict[int, str] = field(default_factory=dict)
    continued: bool = False

    @property
    def counted(self) -> List[int]:
        r"""The layers whose probe counts."""
        return [k for k, c in sorted(self.layers.items()) if c.counted]

    def to_dict(self) -> Dict[str, Any]:
        r"""The certificate as JSON-ready values."""
        return {"eps": self.eps, "tolerances": dataclasses.asdict(self.tolerances),
                "layers": {str(k): dataclasses.asdict(c) for k, c in sorted(self.layers.items())},
                "continuation": {str(k): v for k, v in sorted(self.continuation.items())},
                "continued": self.continued, "counted": self.counted}

    def __str__(self) -> str:
        how = "the fit's optimiser states" if self.continued else "fresh optimiser states"
        rows = [f"Convergence certificate (eps {self.eps:g}, {self.tolerances.steps} further steps with {how}): "
                f"{len(self.counted)} of {len(self.layers)} probes count",
                "layer  verdict    masked before -> after  keep change  KL before -> after  counted"]
        for k, c in sorted(self.layers.items()):
            rows.append(f"{k:>5}  {c.verdict:<9}  {c.masked_before:>13.3f} -> {c.masked_after:<5.3f}  "
                        f"{c.keep_change:>11.3f}  {c.kl_before:>9.4f} -> {c.kl_after:<7.4f}  "
                        + ("yes" if c.counted else "no: " + "; ".join(c.reasons)))
        return "\n".join(rows)


def certify(
    explainer: Any, train: Iterable[Batch], held_out: Sequence[Batch], tolerances: Optional[CertificateTolerances] = None,
    *, state: Optional[Union[str, os.PathLike]] = None, tokenizer: Any = None, seed: Optional[int] = None,
    verbose: bool = False, **fit_options: Any,
) -> Certificate:
    r"""
    Trains a fitted probe further with nothing frozen and says which layers' probes count.

    The explainer is left as it came: the probe, multipliers, verdicts and fit
    record the certificate judged are restored after the further steps.

    Args:

        explainer (DiffMask): a fitted explainer (input or hidden mode).
        train: what its fit took (batches, or texts with ``tokenizer``): the
                    further steps' data.
        held_out: batches (or texts with ``tokenizer``) the fit never saw: where
                    the drift is measured. Read several times, so a sequence.
        tolerances (CertificateTolerances, optional): the allowed drift. Default: ``CertificateTolerances()``
        state (str or PathLike, optional): the file the fit's ``checkpoint``
                    wrote (read, not changed): the further steps go on with its
                    optimiser and multiplier states and its data order, as the
                    fit would have gone on. It must hold the explainer's probe
                    (not one a checkpoint selection replaced). Default: None
                    (fresh optimiser states)
        tokenizer (optional): tokenises texts, as :meth:`DiffMask.fit`. Default: None
        seed (int, optional): the further steps' seed (without ``state``; with
                    it, the RNG goes on as the fit left it). Default: the fit's
        verbose (bool, optional): the further steps' progress. Default: False
        **fit_options: options of the further steps over the fit's own (from
                    its ``fit_record``), e.g. ``eps`` for a probe without a record.

    Returns:
        :class:`Certificate`.
    """
    from captum_diffmask.model.texts import text_batches

    chosen = tolerances if tolerances is not None else CertificateTolerances()
    if explainer.components:
        raise ValueError("certify: the component modes are not certified yet; give an input- or hidden-mode DiffMask")
    if not explainer.is_fitted or not explainer.convergence:
        raise ValueError("certify: the explainer has no fit to certify; call fit first")
    if tokenizer is not None:
        train, held_out = text_batches(train, tokenizer, by_length=True), text_batches(held_out, tokenizer, by_length=True)
    layers = sorted(explainer.convergence)
    fit_state = None if state is None else fit_state_of(explainer, state, layers)
    options = continuation_options(explainer, chosen, seed, verbose, fit_options,
                                   None if fit_state is None else fit_state["state"])
    before = held_out_figures(explainer, held_out, layers)
    saved = _snapshot(explainer)
    try:
        with _going_on(fit_state, layers, chosen.steps) as resumed:
            explainer.fit(train, layers=layers, **{**options, **resumed})
        continuation = {k: str(report["status"]) for k, report in explainer.convergence.items()}
        after = held_out_figures(explainer, held_out, layers)
    finally:
        _restore(explainer, saved)
    certificate = Certificate(float(options["eps"]), chosen, continuation=continuation, continued=state is not None)
    for k in layers:
        certificate.layers[k] = _judge(explainer, held_out, k, before[k], after[k], certificate)
    return certificate


def continuation_options(explainer: Any, tolerances: CertificateTolerances, seed: Optional[int], verbose: bool,
                         overrides: Mapping[str, Any], state: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    r"""
    The options :meth:`DiffMask.fit` continues a fitted probe with: the fit's
    own (its record) with the continuation's caps (``tolerances.steps`` steps,
    every layer trained throughout, no early stop); after a cool-down
    (``Convergence.cooldown``), at the rates it ended at.

    Args:

        explainer (DiffMask): the fitted explainer.
        tolerances (CertificateTolerances): gives the steps.
        seed (int, optional): the continuation's seed; None: the fit's.
        verbose (bool): the continuation's progress.
        overrides (dict): options over the recorded ones.
        state (dict, optional): the fit's ``FitState`` (as its state file holds
                    it) when the continuation goes on from it: its rates are
                    the cool-down's only when the fit reached its cool-down.
                    Default: None

    Returns:
        *dict* of :meth:`DiffMask.fit`'s options.
    """
    recorded = dict(explainer.fit_record.get("options", {}))
    options = {k: v for k, v in recorded.items() if k not in _NOT_CONTINUED}
    options.update(overrides)
    if "eps" not in options:
        raise ValueError("certify: the explainer has no fit record (a probe saved before release 0.2?); give eps=")
    convergence = _convergence_of(options)
    cooled = bool(convergence.get("cooldown")) if state is None else state.get("cooling_from") is not None
    if cooled:
        options.update(_cooled_rates(options, recorded_cooldown_factor(options)))
    convergence.update(until_converged=False, freeze_converged=False, cooldown=0)
    options.update(convergence=convergence, max_steps=tolerances.steps, epochs=None, verbose=verbose)
    if seed is not None:
        options["seed"] = seed
    return options


def recorded_cooldown_factor(options: Mapping[str, Any]) -> float:
    r"""
    The factor a fit's cool-down multiplies its rates by, read from the fit's
    options (its record's ``"options"``, whose ``convergence`` is a
    :class:`Convergence` or its dict).

    Returns:
        *float*; ``Convergence.cooldown_factor`` when the options give none.
    """
    return float(_convergence_of(options).get("cooldown_factor", Convergence.cooldown_factor))


def _convergence_of(options: Mapping[str, Any]) -> Dict[str, Any]:
    r"""The options' ``convergence`` as a dict (a copy; empty when none)."""
    given = options.get("convergence") or {}
    return dataclasses.asdict(given) if dataclasses.is_dataclass(given) else dict(given)


@contextlib.contextmanager
def _going_on(saved: Optional[Mapping[str, Any]], layers: List[int], steps: int) -> Iterator[Dict[str, Any]]:
    r"""The fit options that make the further steps go on from the fit's
    state ``saved`` (a reopened copy in a temporary file, ``steps`` beyond its
    last step); none without a state."""
    if saved is None:
        yield {}
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "continuation.state")
        FitCheckpoint(path, 1).write({**saved, "state": FitState.reopened(saved["state"], layers)})
        yield {"checkpoint": path, "max_steps": int(saved["state"]["step"]) + steps}


def fit_state_of(explainer: Any, state: Union[str, os.PathLike], layers: List[int]) -> Dict[str, Any]:
    r"""
    The fit state in the file ``state``, checked to be the explainer's fit:
    the same probe configuration, layers and model, and the probe it holds.

    Returns:
        *dict*, as the fit wrote it; ValueError naming ``state`` otherwise.
    """
    try:
        saved = FitCheckpoint(state, 1).read(explainer.config(), layers, weights_fingerprint(explainer.model))
    except ValueError as error:
        raise ValueError(f"certify: state {str(error).removeprefix('checkpoint: ')}") from None
    held = explainer.probe.state_dict()
    if set(saved["probe"]) != set(held) or not all(
            torch.equal(saved["probe"][name].to(value.device), value) for name, value in held.items()):
        raise ValueError(f"certify: state {os.fspath(state)} holds another probe than the explainer's (a later fit's, "
                         "or the last one of a fit whose checkpoint selection restored an earlier probe)")
    return saved


def _cooled_rates(options: Mapping[str, Any], factor: float) -> Dict[str, Any]:
    r"""The rates a fit with a cool-down ended at (``lr``, and the baselines'
    and multipliers' rates in ``optimization``), each times ``factor``: the
    continuation goes on as the fit ended, not from its first rates."""
    given = options.get("optimization") or {}
    recipe = dataclasses.asdict(given) if dataclasses.is_dataclass(given) else dict(given)
    rate = recipe.get("lr_lambda")
    rate = default_rate(recipe.get("multiplier", Optimization.multiplier)) if rate is None else rate
    recipe["lr_lambda"] = [factor * r for r in rate] if isinstance(rate, (list, tuple)) else factor * rate
    recipe["lr_baseline"] = factor * recipe.get("lr_baseline", Optimization.lr_baseline)
    return {"lr": factor * options.get("lr", FitOptions.lr), "optimization": recipe}


def _snapshot(explainer: Any) -> Dict[str, Any]:
    return {"probe": copy.deepcopy(explainer.probe.state_dict()), "lambdas": copy.deepcopy(explainer.lambdas.state_dict()),
            "convergence": copy.deepcopy(explainer.convergence), "fit_record": copy.deepcopy(explainer.fit_record),
            "fitted_layers": list(explainer.fitted_layers)}


def _restore(explainer: Any, saved: Mapping[str, Any]) -> None:
    explainer.probe.load_state_dict(saved["probe"])
    explainer.lambdas.load_state_dict(saved["lambdas"])
    explainer.convergence, explainer.fit_record = saved["convergence"], saved["fit_record"]
    explainer.fitted_layers = saved["fitted_layers"]


@torch.no_grad()
def held_out_figures(explainer: Any, held_out: Iterable[Batch], layers: Sequence[int]) -> Dict[int, Dict[str, Any]]:
    r"""
    What the certificate measures a probe by, on ``held_out`` batches.

    Returns:
        *dict* layer -> ``keep`` (the keep probabilities of every real
        position, one flat tensor in the batches' order), ``masked`` (the
        share of real positions whose deterministic gate is closed) and
        ``kl`` (the mean KL under the deterministic gates).
    """
    keep: Dict[int, List[Tensor]] = {k: [] for k in layers}
    for batch in held_out:
        call = explainer.prepare_batch(batch, None, "held_out batch")
        with frozen(explainer.model):
            states, _ = explainer.capture(call, explainer.locator.names)
        for k in layers:
            keep[k].append(explainer.gates.keep_probabilities(states, k, call.mask)[call.mask.bool()].float().cpu())
    scores = explainer.evaluate(held_out, layers)
    return {k: {"keep": torch.cat(keep[k]), "masked": 1.0 - scores[k]["l0"], "kl": scores[k]["kl"]} for k in layers}


def _judge(explainer: Any, held_out: Sequence[Batch], layer: int, before: Mapping[str, Any],
           after: Mapping[str, Any], certificate: Certificate) -> LayerCertificate:
    r"""One layer's certificate from its figures before and after the further steps."""
    tol, eps = certificate.tolerances, certificate.eps
    verdict = str(explainer.convergence[layer]["status"])
    result = LayerCertificate(layer, verdict, before["masked"], after["masked"],
                              float((after["keep"] - before["keep"]).abs().mean()), before["kl"], after["kl"])
    bound = eps * (1.0 + tol.tol_kl)
    if verdict not in SETTLED:
        result.reasons.append(f"the fit's verdict is {verdict}")
    result.reasons.extend(drift_reasons(before, after, tol, eps))
    result.within_bound = result.kl_before <= bound
    if verdict == "needed":
        result.single_closure_kl = single_closure_kl(explainer, held_out, layer, tol.closure_examples)
        if result.single_closure_kl <= bound:
            result.reasons.append(f"closing each example's cheapest single position keeps the constraint "
                                  f"(KL {result.single_closure_kl:.4f}): gates could close that the probe cannot tell apart")
    result.counted = not result.reasons
    return result


def drift_reasons(before: Mapping[str, Any], after: Mapping[str, Any], tolerances: CertificateTolerances,
                  eps: float) -> List[str]:
    r"""
    How a probe moved past the tolerances between two measurements.

    Args:

        before, after (dict): one layer's :func:`held_out_figures`, on the same
                    held-out batches.
        tolerances (CertificateTolerances): the allowed drift.
        eps (float): the fit's eps (the KL's tolerance is a share of it).

    Returns:
        *list of str*: one reason per figure that moved past its tolerance
        (masked share, keep probabilities, KL); empty when none did.
    """
    reasons = []
    masked = abs(after["masked"] - before["masked"])
    if masked > tolerances.masked_share:
        reasons.append(f"the masked share moved by {masked:.3f} (> {tolerances.masked_share:g})")
    keep = float((after["keep"] - before["keep"]).abs().mean())
    if keep > tolerances.keep:
        reasons.append(f"the keep probabilities moved by {keep:.3f} on average (> {tolerances.keep:g})")
    kl = abs(after["kl"] - before["kl"])
    if kl > tolerances.tol_kl * eps:
        reasons.append(f"the held-out KL moved by {kl:.4f} (> {tolerances.tol_kl:g} x eps)")
    return reasons


@torch.no_grad()
def single_closure_kl(explainer: Any, batches: Iterable[Batch], layer: int, examples: int = 32) -> float:
    r"""
    Without the probe's ranking: the mean, over the first ``examples``
    examples, of the KL of each example's cheapest single closure (every real
    position closed alone in turn, replaced by the learned baseline, every
    other gate open).

    Args:

        explainer (DiffMask): a fitted input- or hidden-mode explainer.
        batches (iterable): batches as :meth:`DiffMask.fit` takes them.
        layer (int): the layer whose positions are closed.
        examples (int, optional): how many examples. Default: 32

    Returns:
        *float* nats; ``inf`` when an example has no real position.
    """
    cheapest: List[Tensor] = []
    for batch in batches:
        call = explainer.prepare_batch(batch, None, "batch")
        with frozen(explainer.model):
            states, original = explainer.capture(call, explainer.locator.names)
            cheapest.append(_cheapest_single_closures(explainer, call, states, original, layer))
        if sum(len(c) for c in cheapest) >= examples:
            break
    values = torch.cat(cheapest)[:examples]
    if values.numel() == 0:
        raise ValueError("batches: no examples to close positions in")
    return float(values.mean())


def _cheapest_single_closures(explainer: Any, call: Any, states: Dict[str, Tensor], original: Tensor,
                              layer: int) -> Tensor:
    r"""(B,) each example's least KL over closing one real position alone."""
    real = explainer.gates.positions(call.mask, layer).bool()
    log_p = log_probs(original)
    best = torch.full((real.shape[0],), math.inf, device=log_p.device)
    for position in range(real.shape[1]):
        rows = real[:, position]
        if not bool(rows.any()):
            continue
        gates = torch.ones(real.shape, device=real.device)  # padding stays as it is, as in the fit's closures
        gates[:, position] = (~rows).float()
        logits = masked_logits(explainer.gates, explainer.replaced_logits, call, states, {layer: gates})[layer]
        kl = example_kl(log_p, log_probs(logits))
        best = torch.where(rows, torch.minimum(best, kl.float()), best)
    return best.cpu()
