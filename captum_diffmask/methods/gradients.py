"""Integrated Gradients and Occlusion at a site, through Captum's own classes.

Both methods see the analysed model as a function of the state ``h`` (B, T, H)
at one site (``layer=0``: the token embeddings, ``layer=k``: ``hidden.k``):
``f(h') = logits of the model with the site replaced by h'``. Captum's
:class:`captum.attr.IntegratedGradients` and :class:`captum.attr.Occlusion`
attribute ``f`` at ``h``, and the per-feature result (B, T, H) is reduced to
one score per token.

Padded positions are never moved: their baseline is the state itself, so they
contribute nothing and score exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace as _replace_fields
import warnings
from typing import Any, Dict, Optional, Tuple, Union

import torch
from captum.attr import IntegratedGradients as _CaptumIntegratedGradients, Occlusion as _CaptumOcclusion
from torch import nn, Tensor

from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import (
    BaselineType, ForwardFunc, InputType, PaddingMaskArg, PreparedCall, resolve_baseline, resolve_target, TargetType,
)
from captum_diffmask.model.attribution import (
    attribution_call, check_verdict, ReplacingAttribution, SiteAttribution, SitesType,
)
from captum_diffmask.model.checks import check_positive_int
from captum_diffmask.model.divergences import log_probs
from captum_diffmask.model.forward import frozen

_REDUCTIONS = ("abs_sum", "sum", "l2")
_IG_METHODS = ("riemann_trapezoid", "gausslegendre", "riemann_left", "riemann_right", "riemann_middle")


# --------------------------------------------------------------- shared helpers
def reduce_tokens(attributions: Tensor, reduction: str) -> Tensor:
    r"""(B, T, H) per-feature attributions -> (B, T) per-token scores."""
    if reduction == "abs_sum":
        return attributions.sum(-1).abs()
    if reduction == "sum":
        return attributions.sum(-1)
    if reduction == "l2":
        return attributions.norm(dim=-1)
    raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


class _SiteFunction:
    r"""``f(h', ids, *extra) -> target output`` for Captum: the model with the
    site replaced by ``h'``. Captum repeats ``ids`` and ``extra`` (passed as its
    ``additional_forward_args``) along the batch as it expands ``h'``, so they
    always match."""

    def __init__(self, method: SiteAttribution, call: PreparedCall, targets: Optional[Tensor] = None) -> None:
        self.method = method
        self.call = call
        self.targets = targets

    def __call__(self, state: Tensor, ids: Tensor, *extra: Any) -> Tensor:
        call = _replace_fields(self.call, ids=ids, extra=tuple(extra))
        logits = self.method.replaced_logits(call, {call.site: state})
        if logits.dim() == 2 and logits.shape[1] == 1:
            logits = logits.reshape(-1)  # one binary logit: attribute it directly
        if logits.dim() == 3:
            # K distributions per example (a span's start and end, every position):
            # the attributed output is the sum of the targets' log-probabilities
            assert self.targets is not None
            targets = self.targets.repeat(logits.shape[0] // self.targets.shape[0], 1)
            return log_probs(logits).gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(-1)
        return logits


def _split_targets(logits: Tensor, target: Any) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    r"""Captum's target for (B, C) logits, or the (B, K) targets the site function
    sums the log-probabilities of (then Captum's target is None)."""
    resolved = resolve_target(logits, target)
    return (None, resolved) if logits.dim() == 3 else (resolved, None)


@dataclass
class SiteProblem:
    r"""What Captum is handed for one call: ``function(h', ids, *extra)`` the model
    with the site replaced, the state ``h`` (B, T, H) it is attributed at, the
    ``baseline`` (B, T, H) (the state itself at padding) and Captum's ``target``."""

    call: PreparedCall
    function: _SiteFunction
    state: Tensor
    baseline: Tensor
    target: Optional[Tensor]


class CaptumSiteAttribution(ReplacingAttribution):
    r"""Base of the methods that hand the model, as a function of one site's
    state, to a Captum attribution class (:class:`SiteProblem`)."""

    def site_problem(
        self, inputs: InputType, additional_forward_args: Any, layer: int, target: TargetType,
        baselines: BaselineType,
    ) -> SiteProblem:
        r"""One capture pass on the call's inputs (arguments as ``attribute``'s)
        and what Captum is handed."""
        call = self._prepare(inputs, additional_forward_args, layer)
        states, logits = self.capture(call)
        assert logits is not None
        state = states[call.site].detach()
        captum_target, targets = _split_targets(logits, target)
        baseline = self.baseline_for(call, state, baselines)
        return SiteProblem(call, _SiteFunction(self, call, targets), state, baseline, captum_target)


# ------------------------------------------------------------ Integrated Gradients
@register_method
class IntegratedGradients(CaptumSiteAttribution):
    r"""
    Integrated Gradients (Sundararajan et al., 2017) on the state at a site, the
    gradient baseline DiffMask is compared with. Computed by Captum's
    :class:`captum.attr.IntegratedGradients` on ``f(h') = output of the model with
    the site replaced by h'``.

    Objective: none (no optimisation). With baseline ``b`` and target output
    ``F``, the per-feature attribution is
    ``(h - b) * integral_0^1 dF(b + a (h - b)) / dh da``; the signed attributions
    sum to ``F(h) - F(b)`` (completeness) up to the quadrature error, which
    ``return_convergence_delta=True`` reports.

    Readout: one score per token, ``|sum over H|`` of the attributions by default
    (the authors' comparison), or the signed sum, or the L2 norm over H.

    Cost: ``n_steps`` forward and backward passes per example (batched by
    ``internal_batch_size``), plus one capture pass and the two forward passes
    of the completeness check.

    Every call measures its own error, the completeness gap
    ``|sum of the signed attributions - (F(h) - F(b))|`` per example (two more
    forward passes), over the larger of ``|F(h) - F(b)|`` and the tokens' summed
    absolute scores; keeps its largest in :attr:`last_check` and warns when it
    is over :attr:`GAP_TOLERANCE`.

    The defaults keep that gap small on the families the library supports:
    Captum's Gauss-Legendre quadrature, and each example's mean state over its
    real tokens as the baseline (its own: the rest of a batch does not move it;
    zeros for a text of one token; pass a vector for one baseline shared by
    every text). A zero state is far from a normalised model's states: a state
    that feeds a LayerNorm or RMSNorm through bias-free maps gives a path along
    which the output is constant for a > 0 and jumps at a = 0, where the
    authors' trapezoid rule (``method="riemann_trapezoid"``, ``baselines=0.0``,
    as the paper's suites run it) samples a gradient of 1e5 and more. The defaults keep the gap under
    the tolerance at every depth of config-built BERT, GPT-2, Llama, T5 and
    BART (``tests/library/methods/test_gradients.py``), where the authors'
    settings give scores of 1e8 on BERT's layer 1 for an output difference under
    1e-3; on the SST MiniLM, ``docs/reproduction/ig-gap.md``.

    ``"riemann_trapezoid"`` evaluates the gradient at ``linspace(0, 1, n_steps)``,
    both ends included, as the authors' code does. Captum 0.9 weights those
    points by ``1/n_steps`` with halved ends, weights that sum to
    ``(n_steps - 1) / n_steps``, not 1; the result is rescaled by
    ``n_steps / (n_steps - 1)``, which gives the composite trapezoid rule.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed
                    model and how to call it, as in
                    :class:`~captum_diffmask.model.attribution.ReplacingAttribution`.
        baselines (float or Tensor, optional): the reference state; None: each
                    example's mean state over its real tokens at the site.
                    Default: None
        n_steps (int, optional): points of the path integral. Default: 50
        method (str, optional): Captum's quadrature, ``"gausslegendre"`` or
                    ``"riemann_trapezoid"`` (or another Captum Riemann rule).
                    Default: ``"gausslegendre"``
        reduction (str, optional): per-token readout, ``"abs_sum"``, ``"sum"`` or
                    ``"l2"`` over H. Default: ``"abs_sum"``
        internal_batch_size (int, optional): Captum's chunking of the
                    ``n_steps * B`` path points; all at once when None. Default: None
    """

    summary = "Integrated Gradients at the site, |sum over H| per token"
    #: The largest relative completeness gap a call passes without a warning.
    GAP_TOLERANCE = 0.1
    # (h - b) times the path integral of the gradient, as Captum's own IG
    scores_multiply_inputs = True
    reports_convergence_delta = True

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
        baselines: BaselineType = None,
        n_steps: int = 50,
        method: str = "gausslegendre",
        reduction: str = "abs_sum",
        internal_batch_size: Optional[int] = None,
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output, baselines)
        self._check_options(n_steps, method, reduction, internal_batch_size)
        self.n_steps = n_steps
        self.method = method
        self.reduction = reduction
        self.internal_batch_size = internal_batch_size
        #: layer -> the verdict of the last call there on its completeness gap
        #: (:func:`~captum_diffmask.model.attribution.check_verdict`)
        self.last_check: Dict[int, str] = {}

    def baseline_for(self, call: PreparedCall, state: Tensor, baselines: BaselineType = None) -> Tensor:
        r"""The call's baseline, the constructor's, or each example's mean state
        over its real tokens (see the class docstring)."""
        chosen = self.baselines if baselines is None else baselines
        return resolve_baseline(chosen, state, call.mask, default="example_mean")

    @staticmethod
    def _check_options(n_steps: Any, method: Any, reduction: Any, internal_batch_size: Any) -> None:
        check_positive_int(n_steps, "n_steps")
        if method not in _IG_METHODS:
            raise ValueError(f"method must be one of {_IG_METHODS}, got {method!r}")
        if method.startswith("riemann") and n_steps < 2:
            raise ValueError(f"n_steps must be >= 2 for the Riemann rules, got {n_steps}")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        check_positive_int(internal_batch_size, "internal_batch_size", allow_none=True)

    @attribution_call
    def attribute(  # type: ignore[override]
        self, inputs: InputType, target: TargetType = None, additional_forward_args: Any = None,
        layer: int = 0,
        *,
        baselines: BaselineType = None,
        n_steps: Optional[int] = None,
        method: Optional[str] = None,
        reduction: Optional[str] = None,
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: bool = False,
    ) -> Union[Tensor, Tuple[Tensor], Tuple[Union[Tensor, Tuple[Tensor]], Tensor]]:
        r"""
        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target (int, list or Tensor, optional): for (B, C) logits the class
                        attributed (None = the predicted class); must be None for
                        one binary logit, whose value is attributed. Default: None
            baselines (float or Tensor, optional): this call's reference state
                        (the constructor's when None). Default: None
            n_steps, method, reduction, internal_batch_size (optional): override
                        the constructor's values for this call.
            return_convergence_delta (bool, optional): also return, per example,
                        ``sum of the signed attributions - (F(h) - F(b))``.
                        Default: False

        Returns:
            *Tensor* (B, T) per-token scores, 0 at padding (a 1-tuple if
            ``inputs`` was); with ``return_convergence_delta``, the pair
            ``(scores, delta)`` with ``delta`` of shape (B,).
        """
        n_steps = self.n_steps if n_steps is None else n_steps
        method = self.method if method is None else method
        reduction = self.reduction if reduction is None else reduction
        if internal_batch_size is None:
            internal_batch_size = self.internal_batch_size
        self._check_options(n_steps, method, reduction, internal_batch_size)

        problem = self.site_problem(inputs, additional_forward_args, layer, target, baselines)
        attributions, delta = self._integrate(
            problem.function, problem.state, problem.baseline, problem.target, n_steps, method, internal_batch_size)
        self._check_gap(attributions, delta, problem.call, layer)
        scores = self._finish(reduce_tokens(attributions.detach().float(), reduction), problem.call)
        if return_convergence_delta:
            return scores, delta.detach().float()
        return scores

    def _check_gap(self, attributions: Tensor, delta: Tensor, call: PreparedCall, layer: int) -> None:
        r"""The completeness gap relative to the larger of ``|F(h) - F(b)|`` and
        the tokens' summed ``|sum over H|`` (large attributions that cancel make
        a small difference: the gap is measured against the numbers shown): its
        largest over the examples into :attr:`last_check`, a warning above
        :attr:`GAP_TOLERANCE`."""
        delta, token_sums = delta.detach().float().flatten(), attributions.detach().float().sum(-1).flatten(1)
        relative = completeness_gap(token_sums, delta)
        difference, shown = token_sums.sum(1) - delta, token_sums.abs().sum(1)
        worst = int(relative.argmax())
        gap = float(relative[worst])
        passed = gap <= self.GAP_TOLERANCE
        self.last_check[int(layer)] = check_verdict(f"completeness gap {gap:.2g}", passed)
        if not passed:
            warnings.warn(
                f"IntegratedGradients at {call.site}: the signed attributions miss F(h) - F(b) "
                f"({float(difference[worst]):.3g}) by {float(delta[worst].abs()):.3g}, {gap:.3g} of the larger of it "
                f"and the summed |scores| ({float(shown[worst]):.3g}), in example {worst} (tolerance "
                f"{self.GAP_TOLERANCE}): raise n_steps (internal_batch_size bounds the memory), use "
                "method='gausslegendre', or a baseline nearer the states (baselines=None: each example's mean "
                "state)", UserWarning, stacklevel=5)

    def _integrate(
        self, function: "_SiteFunction", state: Tensor, baseline: Tensor, target: Optional[Tensor], n_steps: int,
        method: str, internal_batch_size: Optional[int],
    ) -> Tuple[Tensor, Tensor]:
        r"""Captum's IG of the site function: (B, T, H) attributions, and the
        convergence delta (B,)."""
        ig = _CaptumIntegratedGradients(function, multiply_by_inputs=True)
        args = (function.call.ids, *function.call.extra)
        with frozen(self.model):
            attributions = ig.attribute(
                state, baselines=baseline, target=target, additional_forward_args=args, n_steps=n_steps,
                method=method, internal_batch_size=internal_batch_size,
            )
            if method == "riemann_trapezoid":
                # Captum's trapezoid weights sum to (n-1)/n; see the class docstring.
                attributions = attributions * (n_steps / (n_steps - 1))
            delta = ig.compute_convergence_delta(
                attributions, start_point=baseline, end_point=state, target=target, additional_forward_args=args,
            )
        return attributions, delta


def completeness_gap(token_sums: Tensor, delta: Tensor) -> Tensor:
    r"""
    Integrated Gradients' relative completeness gap per example:
    ``|delta|`` over the larger of ``|F(h) - F(b)|`` and the summed absolute
    token scores (0 where ``|delta| <= 1e-6``, float rounding).

    Args:

        token_sums (Tensor): (B, T) each token's signed attributions summed over
                    H (``reduction="sum"``'s scores).
        delta (Tensor): (B,) the convergence delta, ``sum - (F(h) - F(b))``.

    Returns:
        *Tensor* (B,) >= 0.
    """
    token_sums, delta = token_sums.detach().float(), delta.detach().float().flatten()
    difference = token_sums.sum(1) - delta
    relative = delta.abs() / torch.maximum(difference.abs(), token_sums.abs().sum(1)).clamp(min=1e-12)
    return torch.where(delta.abs() <= 1e-6, torch.zeros_like(relative), relative)


# ------------------------------------------------------------------- Occlusion
@register_method
class Occlusion(CaptumSiteAttribution):
    r"""
    Leave-one-out occlusion of the state at a site, by Captum's
    :class:`captum.attr.Occlusion` with a window of one token
    (``sliding_window_shapes=(1, H)``; ``attribute`` takes wider windows and
    strides in tokens).

    Objective: none. The score of token t is the drop of the target output when
    only its state is replaced by the baseline:
    ``F(h) - F(h with h_t := b_t)`` (positive = the token supported the output).

    Readout: that drop, one number per token.

    Cost: T + 1 forward passes per example (one per position, pads included,
    plus the original; about T / stride with a stride), ``perturbations_per_eval``
    of them batched together.

    Args:

        model, sites, forward_func, padding_mask_arg, output, baselines: the analysed
                    model, how to call it and what replaces an occluded state, as in
                    :class:`~captum_diffmask.model.attribution.ReplacingAttribution`.
        perturbations_per_eval (int, optional): occlusions per forward pass (each
                    of batch size B). Default: 16
    """

    summary = "leave-one-token-out (Captum's Occlusion, window 1)"

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
        baselines: BaselineType = None,
        perturbations_per_eval: int = 16,
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output, baselines)
        check_positive_int(perturbations_per_eval, "perturbations_per_eval")
        self.perturbations_per_eval = perturbations_per_eval

    @attribution_call
    def attribute(  # type: ignore[override]
        self, inputs: InputType, target: TargetType = None, additional_forward_args: Any = None,
        layer: int = 0,
        *,
        baselines: BaselineType = None,
        perturbations_per_eval: Optional[int] = None,
        sliding_window_shapes: Union[None, int, Tuple[int, ...]] = None,
        strides: Union[None, int, Tuple[int, ...]] = None,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        Replaces each position's state by the baseline in turn and returns how
        much the target output drops.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target (int, list or Tensor, optional): for (B, C) logits the class
                        whose logit is occluded (None = the predicted class); must be
                        None for one binary logit. Default: None
            baselines (float or Tensor, optional): this call's reference state
                        (the constructor's when None). Default: None
            perturbations_per_eval (int, optional): overrides the constructor's.
            sliding_window_shapes (int or tuple, optional): Captum's window, in
                        tokens: ``w``, ``(w,)`` or ``(w, H)`` (a window always
                        spans a token's whole state); a token's score is then the
                        mean drop over the windows that cover it. Default: 1
            strides (int or tuple, optional): Captum's step between windows,
                        in tokens, the same forms. Default: 1

        Returns:
            *Tensor* (B, T): the drop of the target output per occluded token, 0 at
            padding (a 1-tuple if ``inputs`` was).
        """
        if perturbations_per_eval is None:
            perturbations_per_eval = self.perturbations_per_eval
        check_positive_int(perturbations_per_eval, "perturbations_per_eval")
        problem = self.site_problem(inputs, additional_forward_args, layer, target, baselines)
        hidden = problem.state.shape[-1]
        window = token_window(sliding_window_shapes, "sliding_window_shapes", hidden)
        stride = token_window(strides, "strides", hidden)
        occlusion = _CaptumOcclusion(problem.function)
        with frozen(self.model), torch.no_grad():
            attributions = occlusion.attribute(
                problem.state,
                sliding_window_shapes=(window, hidden),
                strides=(stride, hidden),
                baselines=problem.baseline,
                target=problem.target,
                additional_forward_args=(problem.call.ids, *problem.call.extra),
                perturbations_per_eval=perturbations_per_eval,
            )
        # Every feature of a token's window gets the same drop; read one of them.
        return self._finish(attributions[..., 0].float(), problem.call)


def token_window(value: Union[None, int, Tuple[int, ...]], argument: str, hidden: int) -> int:
    r"""
    A number of tokens from Captum's window argument ``value``: ``w``, ``(w,)``
    or ``(w, hidden)``; 1 for None.

    Raises:
        ValueError: naming ``argument``, for any other form or ``w < 1``.
    """
    if value is None:
        return 1
    shape = (value,) if isinstance(value, int) else tuple(value)
    if len(shape) == 2 and shape[1] == hidden:
        shape = shape[:1]
    if len(shape) != 1 or not isinstance(shape[0], int) or isinstance(shape[0], bool) or shape[0] < 1:
        raise ValueError(f"{argument} must be a number of tokens w >= 1, (w,) or (w, {hidden}): a window spans "
                         f"a token's whole state of {hidden}; got {value!r}")
    return shape[0]
