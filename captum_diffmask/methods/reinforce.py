"""REINFORCE: per-example hard masks trained with the score-function estimator,
the paper's non-differentiable comparison (one method per file: the search and
its selection are :class:`~captum_diffmask.methods.per_example.PerExampleMask`'s)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn, Tensor

from captum_diffmask.methods.per_example import MaskSearch, PerExampleMask
from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import ForwardFunc, PaddingMaskArg
from captum_diffmask.model.attribution import SitesType
from captum_diffmask.model.checks import check_choice

_REWARDS = ("lagrangian", "authors")


@register_method
class REINFORCE(PerExampleMask):
    r"""
    Per-example hard masks trained with the score-function (REINFORCE)
    estimator and a moving-average baseline, the paper's non-differentiable
    comparison.

    **Objective.** Per example i, gate logits (T,) initialised to 5, hard gates
    ``g_t ~ Bernoulli(sigmoid(logit_t))`` (1 = kept), the state of the site
    replaced by ``g * h + (1 - g) * b`` with a fixed baseline ``b`` (default: the
    mean state over the batch's real tokens). Each step minimises::

        L0_i + r_i * sum_{real t} log p(g_t) + lambda_i * (KL_i - eps),
        L0_i = sum_{real t} sigmoid(logit_t)                 (exact expected L0)

    where ``KL_i = KL(p_orig || p_masked)`` (no gradient: the model is only run
    forward) and the reward ``r_i`` (no gradient) comes with a per-example
    moving-average baseline ``m_i``, initialised to 0. The last term only gives
    ``lambda_i`` its gradient ``KL_i - eps`` (plain ascent, clamped to [0, 200]).
    Two rewards (``reward=``):

    - ``"lagrangian"`` (default): ``r_i = lambda_i (KL_i - eps) - m_i``, the
      Lagrangian's own term, with ``m_i <- 0.99 m_i + 0.01 lambda_i (KL_i - eps)``
      updated **after** the reward: the same objective as
      :class:`PerExampleDiffMask`, only the gradient estimator differs;
    - ``"authors"``: the authors' code: ``m_i <- 0.99 m_i + 0.01 (KL_i - eps)``
      updated **before** the reward (each reward partly baselines itself) and
      ``r_i = (KL_i - eps) - m_i``, not scaled by the multiplier, so lambda never
      reaches the gates: a penalty of weight 1 on the KL (eps, a constant in the
      reward, is absorbed by the baseline).

    Logits are clamped to [-10, 10]. With ``samples > 1`` the sampled terms are
    averaged over the draws (and the baseline follows their mean). Defaults:
    Adam lr 0.1 for the logits, ascent lr 0.1 for the multipliers, ``eps =
    0.1``, 500 steps, one sample per step.

    **Readouts.** ``readout="keep"``: ``sigmoid(logit_t)``, the probability of
    keeping the token; ``readout="mask"``: the deterministic mask
    ``sigmoid(logit_t) > 0.5``. :meth:`fit_masks` returns both.

    **Cost.** ``steps * samples`` forward passes per example without any
    backward pass through the model, plus one capture and one evaluation pass.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`~captum_diffmask.model.attribution.SiteAttribution`.
        reward (str, optional): ``"lagrangian"`` or ``"authors"``, see above.
                    Default: ``"lagrangian"``
    """

    summary = "hard Bernoulli gates, score-function gradient, per example"
    _name = "REINFORCE"

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto", reward: str = "lagrangian",
    ) -> None:
        check_choice(reward, _REWARDS, "reward")
        super().__init__(model, sites, forward_func, padding_mask_arg, output)
        self.reward = reward

    def _keep(self, logits: Tensor) -> Tensor:
        return torch.sigmoid(logits.float())

    def _loss(self, search: MaskSearch, samples: int) -> Callable[[int], Tensor]:
        real = search.call.mask.float()
        logits, eps = search.logits, search.eps
        moving = torch.zeros(logits.shape[0], device=logits.device)
        authors = self.reward == "authors"

        def loss_fn(step: int) -> Tensor:
            nonlocal moving
            probs = torch.sigmoid(logits)
            lam = search.lambdas()
            with torch.no_grad():
                draws = [torch.bernoulli(probs.detach()) for _ in range(samples)]
                violations = [search.divergence(self._masked_log_q(search, g)) - eps for g in draws]
                violation = torch.stack(violations).mean(0)
                scale = torch.ones_like(lam) if authors else lam.detach()
                if authors:  # the authors' order: the baseline moves before the reward
                    moving = 0.99 * moving + 0.01 * violation
                rewards = [scale * v - moving for v in violations]
                if not authors:  # after the rewards: no sample baselines itself
                    moving = 0.99 * moving + 0.01 * scale * violation
            score = sum((r * (_bernoulli_log_prob(logits, g) * real).sum(-1) for r, g in zip(rewards, draws)),
                        torch.zeros_like(moving))
            l0 = (probs * real).sum(-1)
            return (l0 + score / samples + lam * violation).sum()

        return loss_fn


def _bernoulli_log_prob(logits: Tensor, gates: Tensor) -> Tensor:
    r"""(B, T) log p(g_t) of hard gates under Bernoulli(sigmoid(logit_t))."""
    return gates * F.logsigmoid(logits) + (1.0 - gates) * F.logsigmoid(-logits)
