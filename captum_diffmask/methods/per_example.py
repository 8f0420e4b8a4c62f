"""Masks optimised for one example at a time: DiffMask without a probe, and its
REINFORCE counterpart (De Cao et al., 2020, Section 5, erasure comparison).

Both learn, for every example separately, one gate per token that replaces the
state of a site by a fixed baseline, and minimise the number of open gates
subject to ``KL(original || masked) <= eps`` with one Lagrange multiplier per
example. They differ in the gates and the gradient estimator:

- :class:`PerExampleDiffMask`: Hard Concrete gates, reparameterised gradients
  (the paper's "per-sample DiffMask");
- :class:`REINFORCE`: hard Bernoulli gates, score-function gradients with a
  moving-average baseline.

Because nothing is amortised, they show what an optimiser can find for one
input, hindsight included; DiffMask's probe must decide from the model's states.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers
from captum_diffmask.diffmask.hard_concrete import DIFFMASK_DEFAULTS, HardConcrete
from captum_diffmask.diffmask.probes import mix_baseline
from captum_diffmask.methods.optimization import make_optimizer, optimize, OPTIMIZERS
from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import BaselineType, InputType, PreparedCall, reject_target, resolve_baseline
from captum_diffmask.model.attribution import attribution_call, check_keywords, check_verdict, SiteAttribution
from captum_diffmask.model.checks import check_choice, check_non_negative, check_positive_int
from captum_diffmask.model.divergences import example_kl, log_probs, same_prediction
from captum_diffmask.model.forward import frozen

_READOUTS = ("keep", "mask")
_SELECTIONS = ("last", "feasible", "sparsest")
_DIVERGENCES = ("kl", "prediction")
_LOGIT_RANGE = 10.0


@dataclass
class MaskResult:
    r"""What a per-example mask search found, per example.

    Attributes:
        keep (Tensor): (B, T) float, the probability that each gate is open
                    (``P(z != 0)``) at the returned step, 0 at padding.
        mask (Tensor): (B, T) float, the deterministic mask (1 = kept, 0 =
                    replaced by the baseline): 1 where ``keep > 0.5``; 0 at padding
                    (padding itself is never replaced).
        step (Tensor): (B,) long, the optimisation step (1-based) whose gates
                    are returned: ``steps`` with ``select="last"``, 0 for the
                    starting mask (every token kept).
        kl (Tensor): (B,) the constrained divergence in nats with the deterministic
                    mask: KL(original || masked), or with ``divergence="prediction"``
                    the log-loss of the predicted class against its strongest
                    rival (:meth:`fit_masks`).
        lambdas (Tensor): (B,) the final Lagrange multipliers.
        baseline (Tensor): (B, T, H) what replaced the states (equal to the
                    states at padding).
        log_p (Tensor): (B, C) or (B, K, C) the original output's log-probabilities.
        log_q (Tensor): the same with the deterministic mask.
    """

    keep: Tensor
    mask: Tensor
    step: Tensor
    kl: Tensor
    lambdas: Tensor
    baseline: Tensor
    log_p: Tensor
    log_q: Tensor

    @property
    def agreement(self) -> Tensor:
        r"""(B,) bool: the deterministic mask keeps the argmax of the output.
        Computed when read, so that a search whose selection does not ask for
        the argmax (``select="last"`` or ``"feasible"``) never evaluates it."""
        return same_prediction(self.log_p, self.log_q)


@dataclass
class MaskSearch:
    r"""One batch's search: its call, the site's states (B, T, H), the original
    log-probabilities, the baseline (B, T, H), and what is optimised: gate
    logits (B, T) and one multiplier per example. ``predicted`` holds the
    original predicted class where the constraint is on it
    (``divergence="prediction"``), None for KL(original || masked)."""

    call: PreparedCall
    state: Tensor
    log_p: Tensor
    baseline: Tensor
    logits: Tensor
    lambdas: LagrangeMultipliers
    eps: float
    predicted: Optional[Tensor] = None

    def divergence(self, log_q: Tensor) -> Tensor:
        r"""(B,) the constrained divergence of masked log-probabilities, nats:
        KL(original || masked), or the log-loss of the predicted class against
        its strongest rival, ``softplus(max_{c != y} log q_c - log q_y)``, summed
        over an example's distributions."""
        if self.predicted is None:
            return example_kl(self.log_p, log_q)
        own = log_q.gather(-1, self.predicted)
        rival = log_q.scatter(-1, self.predicted, float("-inf")).amax(-1, keepdim=True)
        loss = F.softplus(rival - own).squeeze(-1)
        return loss.reshape(loss.shape[0], -1).sum(-1)


class _Selection:
    r"""Which step's gates a search returns, per example.

    ``select="last"``: the gates after the last step. Otherwise, every
    ``check_every`` steps (and after the last) the deterministic mask is
    evaluated (one forward pass) and, per example, the one that keeps the fewest
    tokens among the admissible ones is held (the latest of equally small ones).
    Where no sparser one was admitted the search returns the starting mask,
    every token kept (step 0): the original output, which keeps the class and
    has KL 0 (under ``divergence="prediction"`` an output whose own margin is
    too small for ``eps`` admits no mask at all, and keeps every token):

    - ``"feasible"``: admissible when the constrained divergence (``KL(original
      || masked)``, or ``-log masked(predicted class)``) ``<= eps``, the
      constraint the method optimises (its own objective, nothing else);
    - ``"sparsest"``: admissible when the predicted class is kept, the success
      test that defines the erasure optimum (an oracle for an erasure
      comparison: only for comparing with such runs).
    """

    def __init__(self, method: "PerExampleMask", search: MaskSearch, steps: int, check_every: int, select: str) -> None:
        self.method, self.search, self.steps = method, search, steps
        self.check_every, self.select = check_every, select
        batch = search.logits.shape[0]
        device = search.logits.device
        self.chosen = torch.full_like(search.logits.detach(), _LOGIT_RANGE)  # every gate open
        self.step = torch.full((batch,), steps if select == "last" else 0, dtype=torch.long, device=device)
        self.smallest = search.call.mask.float().sum(-1)

    def _admissible(self, log_q: Tensor) -> Tensor:
        search = self.search
        if self.select == "feasible":
            return search.divergence(log_q) <= search.eps
        return same_prediction(log_q, search.log_p)

    @torch.no_grad()
    def __call__(self, step: int) -> None:
        if self.select == "last" or ((step + 1) % self.check_every and step + 1 != self.steps):
            return
        search = self.search
        hard = (self.method._keep(search.logits.detach()) > 0.5).float()
        admissible = self._admissible(self.method._masked_log_q(search, hard))
        size = (hard * search.call.mask.float()).sum(-1)
        better = admissible & (size <= self.smallest)
        self.smallest[better] = size[better]
        self.chosen[better] = search.logits.detach()[better]
        self.step[better] = step + 1

    def final_logits(self) -> Tensor:
        r"""Per example the held logits (every gate open where nothing sparser was
        admitted); the last step's with ``select="last"``."""
        return self.search.logits.detach() if self.select == "last" else self.chosen


def _check_search_options(eps: Any, optimizer: Any, samples: Any, select: Any, check_every: Any,
                          divergence: Any) -> None:
    check_non_negative(eps, "eps")
    check_choice(divergence, _DIVERGENCES, "divergence")
    check_choice(optimizer, OPTIMIZERS, "optimizer")
    check_positive_int(samples, "samples")
    check_choice(select, _SELECTIONS, "select")
    check_positive_int(check_every, "check_every")


class PerExampleMask(SiteAttribution):
    r"""The shared search: per-example gate logits (B, T) and multipliers (B,)."""

    _name = "per-example mask"

    uses_target = False
    scores_are_probabilities = True
    uses_baselines = True

    #: layer -> the verdict of the last ``attribute`` there: how many of the
    #: batch's deterministic masks meet the constraint
    #: (:func:`~captum_diffmask.model.attribution.check_verdict`); each call
    #: sets a new dict on the instance (no constructor: its arguments are the
    #: site machinery's, which ``prepare_method`` routes options by)
    last_check: Dict[int, str] = {}

    def _masked_log_q(self, search: MaskSearch, gates: Tensor) -> Tensor:
        call = search.call
        gates = torch.where(call.mask, gates, torch.ones_like(gates))  # padding is never replaced
        masked = mix_baseline(search.state, gates, search.baseline)
        return log_probs(self.replaced_logits(call, {call.site: masked}))

    def _keep(self, logits: Tensor) -> Tensor:
        raise NotImplementedError

    def _loss(self, search: MaskSearch, samples: int) -> Callable[[int], Tensor]:
        r"""``loss(step)``: the summed per-example objective of one step."""
        raise NotImplementedError

    def _optimize(
        self, search: MaskSearch, steps: int, lr: float, lr_lambda: float, optimizer: str, samples: int,
        verbose: bool, monitor: Callable[[int], None],
    ) -> None:
        r"""The gate logits descend (``optimizer``, then clamped), the multipliers
        ascend (plain ascent at ``lr_lambda``, clamped to [0, 200])."""
        opt = make_optimizer(optimizer, search.logits, lr)
        lambda_opt = search.lambdas.optimizer(lr_lambda)

        def after_step(step: int) -> None:
            lambda_opt.step()
            lambda_opt.zero_grad(set_to_none=True)
            search.lambdas.clamp_()
            with torch.no_grad():
                search.logits.clamp_(-_LOGIT_RANGE, _LOGIT_RANGE)
            monitor(step)

        optimize(self._loss(search, samples), opt, steps, self._name, verbose, after_step)

    def fit_masks(
        self, inputs: InputType, additional_forward_args: Any = None, layer: int = 0,
        eps: float = 0.1,
        steps: int = 500,
        lr: float = 0.1,
        lr_lambda: float = 0.1,
        baselines: BaselineType = None,
        optimizer: str = "adam",
        samples: int = 1,
        verbose: bool = True,
        select: str = "last",
        check_every: int = 10,
        divergence: str = "kl",
    ) -> MaskResult:
        r"""
        Searches a mask for every example (all at once, each with its own gates
        and multiplier) and evaluates the deterministic masks.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            eps (float, optional): the margin on KL(original || masked), nats.
                        Default: 0.1
            steps (int, optional): optimisation steps. Default: 500
            lr (float, optional): learning rate of the gate logits. Default: 0.1
            lr_lambda (float, optional): the multipliers' rate of plain ascent on
                        ``KL - eps`` (clamped to [0, 200]). Default: 0.1
            baselines (float or Tensor, optional): what replaces a masked state:
                        a constant, a vector (H,) or a (B, T, H) tensor; None = the
                        mean state of the site over the batch's real tokens.
            optimizer (str, optional): ``"adam"`` or ``"rmsprop"`` (centred).
            samples (int, optional): gate samples per step (losses averaged).
            verbose (bool, optional): tqdm progress bar. Default: True
            select (str, optional): ``"last"`` (the gates after the last step),
                        ``"feasible"`` (per example, the sparsest deterministic
                        mask among the checks whose KL(original || masked) <=
                        eps: the method's own constraint) or ``"sparsest"`` (the
                        sparsest that keeps the predicted class: the erasure
                        optimum's own test, an oracle in an erasure comparison).
                        Each check costs one forward pass. Default: ``"last"``
            check_every (int, optional): steps between checks. Default: 10
            divergence (str, optional): what ``eps`` bounds: ``"kl"``,
                        KL(original || masked) (DiffMask's constraint), or
                        ``"prediction"``, the log-loss of the original predicted
                        class y against its strongest rival in the masked
                        output, ``softplus(max_{c != y} log q_c - log q_y)`` (the
                        paper's D*[y || y_hat] with y the prediction, the two
                        classes that decide it): below log 2 exactly when y stays
                        the argmax, so with ``eps < log 2`` every mask that meets
                        it keeps the predicted class. Default: ``"kl"``

        Returns:
            *MaskResult*: (B, T) keep probabilities and deterministic masks, the
            step they come from, per-example KL and multipliers (and the argmax
            agreement, computed when read).
        """
        call = self._prepare(inputs, additional_forward_args, layer)
        _check_search_options(eps, optimizer, samples, select, check_every, divergence)
        search = self._start(call, baselines, float(eps), divergence)
        selection = _Selection(self, search, steps, check_every, select)
        with frozen(self.model):
            self._optimize(search, steps, lr, lr_lambda, optimizer, samples, verbose, selection)
            with torch.no_grad():
                return self._result(search, selection)

    def _start(self, call: PreparedCall, baselines: BaselineType, eps: float, divergence: str = "kl") -> MaskSearch:
        states, original = self.capture(call)
        assert original is not None
        state = states[call.site]
        call.mask = call.mask.to(state.device)
        baseline = resolve_baseline(baselines, state, call.mask, default="mean")
        logits = torch.full(state.shape[:-1], 5.0, device=state.device, requires_grad=True)
        lambdas = LagrangeMultipliers(state.shape[0]).to(state.device)
        log_p = log_probs(original)
        predicted = log_p.argmax(-1, keepdim=True) if divergence == "prediction" else None
        return MaskSearch(call, state, log_p, baseline, logits, lambdas, eps, predicted)

    def _result(self, search: MaskSearch, selection: _Selection) -> MaskResult:
        real = search.call.mask.float()
        keep = self._keep(selection.final_logits())
        hard = (keep > 0.5).float()
        log_q = self._masked_log_q(search, hard)
        return MaskResult(
            keep=keep * real,
            mask=hard * real,
            step=selection.step,  # `steps` where no check admitted a mask
            kl=search.divergence(log_q),
            lambdas=search.lambdas.values.detach().clone(),
            baseline=search.baseline,
            log_p=search.log_p,
            log_q=log_q,
        )

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: int = 0,
        readout: str = "keep",
        **search_options: Any,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        Searches a mask per example (see :meth:`fit_masks`) and returns one readout.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target: must be None: the constraint covers the whole output
                        distribution (a target is an error, not ignored). Default: None
            readout (str, optional): ``"keep"``: the probability that each gate
                        is open, in [0, 1]; ``"mask"``: the deterministic 0/1 mask
                        (``keep > 0.5``). Default: ``"keep"``
            search_options: ``eps``, ``steps``, ``lr``, ``lr_lambda``, ``baselines``,
                        ``optimizer``, ``samples``, ``verbose``, ``select``,
                        ``check_every``, ``divergence``, as in :meth:`fit_masks`
                        (its defaults).

        Returns:
            *Tensor* (B, T) float (a 1-tuple when ``inputs`` is a tuple), higher =
            more important, 0 at padding, on the device of the inputs (as every
            method's).
        """
        reject_target(target, self._name)
        check_choice(readout, _READOUTS, "readout")
        call = self._prepare(inputs, additional_forward_args, layer)  # for the finish: device, structure
        check_keywords(f"{type(self).__name__}.attribute()", search_options, type(self).attribute, self.fit_masks)
        result = self.fit_masks(inputs, additional_forward_args, layer, **search_options)
        eps = float(search_options.get("eps", inspect.signature(self.fit_masks).parameters["eps"].default))
        met = int((result.kl <= eps).sum())
        verdict = check_verdict(f"{met} of {len(result.kl)} masks within eps {eps:g}", met == len(result.kl))
        self.last_check = {**self.last_check, int(layer): verdict}
        return self._finish(result.keep if readout == "keep" else result.mask, call)


@register_method
class PerExampleDiffMask(PerExampleMask):
    r"""
    DiffMask without a probe ("per-sample DiffMask", De Cao et al. 2020): the
    gate logits of every token of every example are free parameters.

    **Objective.** Per example i, gate logits (T,) initialised to 5 (gates
    open), Hard Concrete gates ``z`` (temperature 0.2, stretch (-0.2, 1.0), as
    :class:`DiffMask`), the state of the site replaced by ``z * h + (1 - z) * b``
    with a fixed baseline ``b`` (default: the mean state over the batch's real
    tokens), and the per-example Lagrangian::

        L0_i + lambda_i * (KL(p_orig || p_masked)_i - eps),
        L0_i = sum_{real t} P(z_t != 0)

    (with ``divergence="prediction"``, the log-loss of the predicted class
    against its strongest rival in place of the KL: a constraint that keeps the
    class, :meth:`fit_masks`).

    The gate logits descend (Adam, lr 0.1 by default; clamped to [-10, 10] after
    each step), each ``lambda_i`` ascends (plain gradient ascent, lr 0.1, clamped
    to [0, 200]). One gate sample per step by default. Padding is never replaced.

    **Readouts.** ``attribute(..., readout="keep")``: ``P(z_t != 0)`` after the
    optimisation, in [0, 1]; ``readout="mask"``: the deterministic mask
    ``P(z_t != 0) > 0.5``. :meth:`fit_masks` returns both, with the KL and the
    argmax agreement of the deterministic mask.

    **Cost.** ``steps * samples`` forward and backward passes per example (the
    batch is optimised at once), plus one capture pass and one evaluation pass.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`~captum_diffmask.model.attribution.SiteAttribution`.
    """

    summary = "DiffMask gates optimised per example (no probe)"
    _name = "PerExampleDiffMask"

    def _keep(self, logits: Tensor) -> Tensor:
        return HardConcrete(logits, *DIFFMASK_DEFAULTS[:1], DIFFMASK_DEFAULTS[1:]).prob_nonzero()

    def _loss(self, search: MaskSearch, samples: int) -> Callable[[int], Tensor]:
        real = search.call.mask.float()

        def loss_fn(step: int) -> Tensor:
            dist = HardConcrete(search.logits, *DIFFMASK_DEFAULTS[:1], DIFFMASK_DEFAULTS[1:])
            kl = torch.zeros(search.logits.shape[0], device=search.logits.device)
            for _ in range(samples):
                kl = kl + search.divergence(self._masked_log_q(search, dist.rsample()))
            l0 = (dist.prob_nonzero() * real).sum(-1)
            return (l0 + search.lambdas() * (kl / samples - search.eps)).sum()

        return loss_fn


