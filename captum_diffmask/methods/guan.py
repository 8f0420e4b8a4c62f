"""Guan, Wang, Zhang, Chen, He and Xie (ICML 2019), "Towards a Deep and Unified
Understanding of Deep Neural Models in NLP", as adapted in DiffMask's code.

Per example, each token's state gets isotropic Gaussian noise of a learned
scale; the optimisation makes the noise as large as possible (maximum entropy)
while the output stays close to the original. A token that tolerates little
noise matters.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from captum_diffmask.methods.optimization import make_optimizer, optimize
from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import InputType, PreparedCall, reject_target
from captum_diffmask.model.attribution import attribution_call, SiteAttribution
from captum_diffmask.model.checks import check_choice, check_non_negative
from captum_diffmask.model.forward import frozen

_READOUTS = ("inverse", "neg_sigma")


@register_method
class Guan(SiteAttribution):
    r"""
    Learned per-token noise (Guan et al., ICML 2019) in the form DiffMask's
    comparison used: softplus noise scales, the deviation of the output logits
    (or of a later site), an exact Gaussian entropy per token, centred RMSprop.

    **Objective.** Per example, ``sigma_t = softplus(s_t)`` with ``s`` of shape
    (B, T) initialised to -5 (``sigma`` about 0.0067), the site's state becomes::

        h~_t = h_t + sigma_t * n_t,    n_t ~ N(0, I_H)

    (isotropic over H), and the minimised loss is::

        D(h~) - lam * sum_{real t} log sigma_t

    where ``D`` is the mean squared difference between the noisy and the
    original logits (over classes; a single binary logit is one class), or, with
    ``deviation_site``, between the noisy and original states of that later
    site (over its real tokens and dimensions); ``log sigma_t`` is the entropy
    of ``N(0, sigma_t^2)`` up to a constant. One noise draw per step.

    **lam default.** 1.0: the value DiffMask's authors used on the toy task (the
    paper's appendix states 1e-4 for Guan's method). The deviation is not
    normalised, so ``lam`` must be scaled to the size of the logits (the authors
    used 0.1 for SST and 5 for SQuAD).

    **Readout.** The smaller the tolerated noise, the more important the token:
    ``readout="inverse"`` returns ``1 / sigma_t`` (> 0; DiffMask's toy and SQuAD
    plots), ``"neg_sigma"`` returns ``-sigma_t`` (< 0; its SST plots). Higher =
    more important; padding gets 0 (and is never perturbed).

    **Cost.** ``steps`` forward and backward passes per example (the whole batch
    at once), plus one capture pass.

    Guan et al.'s original uses ``sigma = sigmoid(ratio) * scale``, a
    normalised deviation of an intermediate layer, Adam lr 0.01 for 5000 steps
    and keeps the best state; ``optimizer="adam"`` and ``deviation_site`` get
    closer to it.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`~captum_diffmask.model.attribution.SiteAttribution`.
    """

    summary = "Guan et al. 2019, per-token noise scale with an entropy bonus"
    uses_target = False

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: int = 0,
        steps: int = 500,
        lr: float = 0.1,
        lam: float = 1.0,
        deviation_site: Optional[str] = None,
        readout: str = "inverse",
        optimizer: str = "rmsprop",
        verbose: bool = True,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        Optimises the noise scales of every example (all at once) and reads them.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target: must be None: the deviation covers the whole output (a
                        target is an error, not ignored). Default: None
            steps (int, optional): optimisation steps. Default: 500
            lr (float, optional): learning rate. Default: 0.1
            lam (float, optional): weight of the entropy term. Default: 1.0
            deviation_site (str, optional): a site after the attributed one
                        (e.g. ``"hidden.2"``) whose states replace the logits in the
                        deviation. Default: None (the logits)
            readout (str, optional): ``"inverse"`` (``1 / sigma``) or
                        ``"neg_sigma"`` (``-sigma``). Default: ``"inverse"``
            optimizer (str, optional): ``"rmsprop"`` (centred) or ``"adam"``.
                        Default: ``"rmsprop"``
            verbose (bool, optional): tqdm progress bar. Default: True

        Returns:
            *Tensor* (B, T) (a 1-tuple when ``inputs`` is a tuple) of scores,
            higher = more important, 0 at padding.
        """
        reject_target(target, "Guan", "the whole output (its deviation)")
        call = self._prepare(inputs, additional_forward_args, layer)
        check_choice(readout, _READOUTS, "readout")
        check_non_negative(lam, "lam")
        state, reference = self._reference(call, deviation_site)
        s = torch.full(state.shape[:-1], -5.0, device=state.device, requires_grad=True)
        opt = make_optimizer(optimizer, s, lr)
        loss_fn = self._loss(call, state, reference, s, float(lam), deviation_site)
        with frozen(self.model):
            optimize(loss_fn, opt, steps, "Guan", verbose)

        with torch.no_grad():
            sigma = F.softplus(s)
            scores = 1.0 / sigma.clamp(min=1e-30) if readout == "inverse" else -sigma
        return self._finish(scores, call)

    def _reference(self, call: PreparedCall, deviation_site: Optional[str]) -> Tuple[Tensor, Tensor]:
        r"""The attributed site's states and what the deviation is measured
        against: the original logits, or the states of ``deviation_site``."""
        if deviation_site is None:
            states, original = self.capture(call)
            assert original is not None
            return states[call.site], original.float()
        names = self.locator.names
        if deviation_site not in names:
            raise ValueError(f"deviation_site must be one of {names}, got {deviation_site!r}")
        if names.index(deviation_site) <= names.index(call.site):
            raise ValueError(
                f"deviation_site must come after the attributed site {call.site!r} "
                f"(in the order {names}), got {deviation_site!r}"
            )
        states, _ = self.capture(call, [call.site, deviation_site])
        return states[call.site], states[deviation_site].float()

    def _loss(
        self, call: PreparedCall, state: Tensor, reference: Tensor, s: Tensor, lam: float,
        deviation_site: Optional[str],
    ) -> Callable[[int], Tensor]:
        r"""``loss(step)``: the deviation of one noisy pass minus ``lam`` times the
        entropy of the noise, summed over the batch."""
        real = call.mask.to(state.device)

        def deviation(noisy: Tensor) -> Tensor:
            squared = (noisy.float() - reference).pow(2)
            if deviation_site is None:  # (B,) or (B, C) logits
                return squared.reshape(squared.shape[0], -1).mean(-1)
            weights = real.float().unsqueeze(-1).expand_as(squared)
            return (squared * weights).sum((1, 2)) / weights.sum((1, 2)).clamp(min=1.0)

        def loss_fn(step: int) -> Tensor:
            # sigma = 0 at padding: padded positions are never perturbed.
            sigma = torch.where(real, F.softplus(s), torch.zeros_like(s))
            noise = torch.randn_like(state, dtype=torch.float32)
            noisy_state = (state.float() + sigma.unsqueeze(-1) * noise).to(state.dtype)
            if deviation_site is None:
                noisy = self.replaced_logits(call, {call.site: noisy_state})
            else:
                with self.locator.capture([deviation_site]) as seen:
                    self.replaced_logits(call, {call.site: noisy_state})
                noisy = seen[deviation_site]
            # log softplus(s), computed stably for very negative s
            log_sigma = torch.where(s < -15.0, s, torch.log(F.softplus(s.clamp(min=-15.0))))
            entropy = (log_sigma * real.float()).sum(-1)
            return (deviation(noisy) - lam * entropy).sum()

        return loss_fn
