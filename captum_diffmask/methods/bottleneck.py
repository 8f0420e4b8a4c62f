"""The Per-Sample Bottleneck of Schulz, Sixt, Tombari and Landgraf (ICLR 2020),
"Restricting the Flow: Information Bottlenecks for Attribution", on the token
states of a site, as DiffMask's paper compared it.

Per example, a learned per-token weight ``lambda_t = sigmoid(alpha_t)`` mixes the
state with noise drawn from the data's own statistics,
``z_t = lambda_t * h_t + (1 - lambda_t) * eps_t`` with ``eps_t ~ N(mu, std^2)``, so a
token whose information the model does not need can be drowned in noise. The
optimisation trades the task loss against the information that still flows, an
upper bound given by the KL of the bottleneck's distribution to the noise prior.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn, Tensor

from captum_diffmask.methods.optimization import make_optimizer, optimize
from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import (
    ForwardFunc, InputType, PaddingMaskArg, PreparedCall, resolve_target, site_for_layer,
)
from captum_diffmask.model.attribution import attribution_call, SiteAttribution, SitesType
from captum_diffmask.model.checks import check_choice, check_non_negative, check_positive_int
from captum_diffmask.model.divergences import log_probs
from captum_diffmask.model.forward import Batch, frozen

_READOUTS = ("alpha", "capacity")


def capacity_nats(alpha: Tensor, state: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    r"""
    The per-element information that flows through the bottleneck:
    ``KL(N(lambda * r, (1 - lambda)^2) || N(0, 1))`` with ``r = (h - mu) / std`` and
    ``lambda = sigmoid(alpha)``, in nats.

    Args:

        alpha (Tensor): (B, T) per-token or (B, T, H) per-element logits of lambda.
        state (Tensor): (B, T, H) the original activations.
        mean (Tensor): (H,) the data mean of the site.
        std (Tensor): (H,) the data standard deviation of the site (> 0).

    Returns:
        *Tensor* (B, T, H) float32, >= 0.
    """
    alpha = alpha.float() if alpha.dim() == state.dim() else alpha.float().unsqueeze(-1)
    lam = torch.sigmoid(alpha)
    r = (state.float() - mean) / std
    mu_z = lam * r
    # log (1 - lambda)^2 = 2 log sigmoid(-alpha): finite even where lambda rounds to 1.
    log_var = 2.0 * F.logsigmoid(-alpha)
    var = log_var.exp()
    return (-0.5 * (1.0 + log_var - mu_z.pow(2) - var)).clamp(min=0.0)


def bottleneck_scores(alpha: Tensor, state: Tensor, mean: Tensor, std: Tensor, readout: str) -> Tensor:
    r"""
    The bottleneck read as per-token scores.

    Args:

        alpha (Tensor): (B, T) per-token or (B, T, H) per-element logits of lambda.
        state, mean, std: as for :func:`capacity_nats`.
        readout (str): ``"alpha"``: ``sigmoid(alpha)``, averaged over H when it is
                    per element; ``"capacity"``: :func:`capacity_nats` summed over
                    H, in bits.

    Returns:
        *Tensor* (B, T) float32.
    """
    if readout == "alpha":
        share = torch.sigmoid(alpha.float())
        return share.mean(-1) if alpha.dim() == state.dim() else share
    return capacity_nats(alpha, state, mean, std).sum(-1) / math.log(2.0)


def noisy_state(state: Tensor, lam: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    r"""
    The bottleneck's sample ``z = lambda * h + (1 - lambda) * eps`` with
    ``eps ~ N(mean, std^2)`` drawn per element.

    Args:

        state (Tensor): (B, T, H) the original activations.
        lam (Tensor): (B, T, 1) or (B, T, H) the share that flows, in [0, 1].
        mean (Tensor): (H,) the data mean of the site.
        std (Tensor): (H,) the data standard deviation of the site.

    Returns:
        *Tensor* (B, T, H) in the state's dtype; gradients flow into ``lam``.
    """
    noise = mean + std * torch.randn_like(state, dtype=torch.float32)
    return (lam * state.float() + (1.0 - lam) * noise).to(state.dtype)


def site_statistics(
    explainer: SiteAttribution, dataloader: Iterable[Batch], layer: int, sites: Sequence[str],
    min_std: float = 0.01, max_batches: Optional[int] = None,
) -> Dict[str, Tuple[Tensor, Tensor]]:
    r"""
    The mean and standard deviation of each hidden dimension of ``sites`` over
    the real (non-padding) tokens of a data set, pooled over positions.

    Args:

        explainer (SiteAttribution): reads the sites (one pass per batch, stopped
                    once they are read).
        dataloader (iterable): batches as :meth:`DiffMask.fit` takes them.
        layer (int): the layer the batches are prepared for (checked as ``layer``).
        sites (sequence of str): the site names.
        min_std (float, optional): floor of the standard deviation. Default: 0.01
        max_batches (int, optional): read at most this many batches. Default: None

    Returns:
        *dict* site -> ``(mean, std)``, each (H,) float32.
    """
    if not min_std >= 0:
        raise ValueError(f"min_std must be >= 0, got {min_std!r}")
    count = 0
    totals: Dict[str, Tuple[Tensor, Tensor]] = {}
    with frozen(explainer.model):
        for index, batch in enumerate(dataloader):
            if max_batches is not None and index >= max_batches:
                break
            call = explainer.prepare_batch(batch, layer, "dataloader batch")
            states, _ = explainer.capture(call, sites, stop_early=True)
            for site in sites:
                real = states[site][call.mask].double()  # (N, H): real tokens only
                total, total_sq = totals.get(site, (0.0, 0.0))
                totals[site] = (real.sum(0) + total, real.pow(2).sum(0) + total_sq)
            count += int(call.mask.sum())
    if not totals or count == 0:
        raise ValueError("dataloader gave no real tokens to estimate the statistics from")
    statistics = {}
    for site, (total, total_sq) in totals.items():
        mean = total / count
        std = (total_sq / count - mean.pow(2)).clamp(min=0.0).sqrt().clamp(min=min_std)
        statistics[site] = (mean.float(), std.float())
    return statistics


class GaussianBottleneck(SiteAttribution):
    r"""
    Base of the two bottlenecks of Schulz et al. (2020): a state is mixed with
    Gaussian noise whose mean and standard deviation, per hidden dimension, are
    estimated on data, so both need data before they attribute.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`~captum_diffmask.model.attribution.SiteAttribution`.
    """

    needs_data = True

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output)
        #: ``{site: (mean, std)}``, each (H,) float32, over the data's real tokens.
        self.statistics: Dict[str, Tuple[Tensor, Tensor]] = {}

    def estimate_statistics(
        self, dataloader: Iterable[Batch], layer: int, sites: Sequence[str], min_std: float = 0.01,
        max_batches: Optional[int] = None,
    ) -> None:
        r"""Estimates and stores the statistics of ``sites`` (:func:`site_statistics`,
        whose arguments these are), replacing any stored for them."""
        self.statistics.update(site_statistics(self, dataloader, layer, sites, min_std, max_batches))

    def noise_statistics(self, site: str, state: Tensor) -> Tuple[Tensor, Tensor]:
        r"""
        The stored ``(mean, std)`` of ``site`` on the device of ``state``.

        Args:

            site (str): the site's name.
            state (Tensor): (B, T, H) the site's state.

        Returns:
            *tuple* of two (H,) float32 tensors. Raises a ``ValueError`` naming
            the missing site or the mismatched size.
        """
        if site not in self.statistics:
            raise ValueError(f"layer: no statistics for the site {site!r}; call "
                             f"{self.data_step}(dataloader, layer=...) for its layer first")
        mean, std = (t.to(state.device) for t in self.statistics[site])
        if mean.shape != state.shape[-1:]:
            raise ValueError(f"layer: the statistics of {site!r} have size {mean.shape[0]}, "
                             f"the site's states have size {state.shape[-1]}")
        return mean, std


@register_method
class PerSampleBottleneck(GaussianBottleneck):
    r"""
    Per-Sample Bottleneck (Schulz et al., ICLR 2020) at the token level, as in
    DiffMask's comparison (De Cao et al., 2020, and their code): one parameter
    per token, shared over the H dimensions of the state.

    **Objective.** For each example, with ``lambda_t = sigmoid(alpha_t)`` (``alpha``
    of shape (B, T), initialised to 5, i.e. nearly everything flows), the state
    of the site is replaced by::

        z_t = lambda_t * h_t + (1 - lambda_t) * eps_t,    eps_t ~ N(mu, std^2)

    where ``mu`` and ``std`` (per hidden dimension) come from
    :meth:`fit_statistics`. The minimised loss is::

        -log q(target | z) + beta * (1 / n) * sum_{real t} C_t,
        C_t = sum_H KL(N(lambda_t * r_t, (1 - lambda_t)^2) || N(0, 1)),
        r_t = (h_t - mu) / std,

    with ``q`` the model's output distribution on the noisy state, ``target``
    the model's own prediction when None, and ``n`` the example's number of real
    tokens. **beta convention:** ``C_t`` is summed over the H dimensions and
    averaged over real tokens, and the default ``beta = 10 / H``; that is
    ``10 * mean`` over the (real token, dimension) elements, the paper's
    "beta = 10 / k" with k = H (the IBA code's "beta = 10 on the mean").
    The DiffMask code averaged over all T positions, padding included; here
    padding never counts and is never perturbed (``lambda = 1`` there).

    **Readout.** ``readout="alpha"``: ``sigmoid(alpha_t)`` in [0, 1], the
    share of the state that flows (DiffMask's comparison); ``"capacity"``:
    ``C_t`` in bits (``/ ln 2``), Schulz et al.'s heatmap summed over H. Both:
    higher = more important, 0 at padding.

    **Cost.** ``steps * samples`` forward and backward passes per example (the
    whole batch is optimised at once with per-example parameters), plus one
    capture pass; :meth:`fit_statistics` costs one pass per statistics batch,
    once per layer.

    Defaults follow the DiffMask paper's toy-task appendix: centred RMSprop,
    lr 0.1, 500 steps, one noise sample per step. The original IBA setting is
    ``optimizer="adam", lr=1.0, steps=10, samples=10``.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`~captum_diffmask.model.attribution.SiteAttribution`.

    Examples::

        >>> bottleneck = PerSampleBottleneck(model)
        >>> bottleneck.fit_statistics(train_loader, layer=3)
        >>> scores = bottleneck.attribute(ids, additional_forward_args=(mask,), layer=3)
    """

    summary = "Schulz et al. 2020, per-example Gaussian bottleneck"
    data_step = "fit_statistics"

    @torch.no_grad()
    def is_prepared(self, layer: Optional[int]) -> bool:
        r"""Whether the statistics of ``layer``'s site are estimated."""
        return layer is not None and site_for_layer(layer, self.num_layers) in self.statistics

    def prepare_on_data(
        self, train_data: Iterable[Batch], layer: Optional[int], options: Mapping[str, Any], seed: int = 0,
        verbose: bool = False, max_steps: Optional[int] = None,
    ) -> Dict[str, Any]:
        r"""Estimates the statistics of ``layer``'s site (:meth:`fit_statistics`
        with ``options``); ``seed``, ``verbose`` and ``max_steps`` are unused (an
        average over the data, no optimisation)."""
        if layer is None:
            raise ValueError("layer: PerSampleBottleneck attributes one layer at a time, got None")
        self.fit_statistics(train_data, layer=layer, **options)
        return {}

    def fit_statistics(
        self,
        dataloader: Iterable[Batch],
        layer: int,
        min_std: float = 0.01,
        max_batches: Optional[int] = None,
    ) -> Tuple[Tensor, Tensor]:
        r"""
        Estimates the mean and standard deviation of each hidden dimension of
        the site of ``layer`` over the real (non-padding) tokens of a data set,
        pooled over positions, and stores them for :meth:`attribute`.

        Args:

            dataloader (iterable): batches as :meth:`DiffMask.fit` takes them:
                        token ids (B, T), ``(ids, *additional_forward_args)`` or a
                        mapping with ``input_ids``/``attention_mask``.
            layer (int): 0 for the ``input`` site, k for ``hidden.k``.
            min_std (float, optional): floor of the standard deviation, so that
                        constant dimensions do not make the capacity explode
                        (IBA's default). Default: 0.01
            max_batches (int, optional): read at most this many batches.
                        Default: None (all)

        Returns:
            *tuple* ``(mean, std)`` of (H,) float32 tensors, stored as
            ``statistics[site]``.
        """
        site = site_for_layer(layer, self.num_layers)
        self.estimate_statistics(dataloader, layer, [site], min_std, max_batches)
        return self.statistics[site]

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: int = 0,
        steps: int = 500,
        lr: float = 0.1,
        beta: Optional[float] = None,
        samples: int = 1,
        readout: str = "alpha",
        optimizer: str = "rmsprop",
        verbose: bool = True,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        Optimises one bottleneck per example (all examples at once) and reads it.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`);
                        :meth:`fit_statistics` must have run for ``layer``.
            target (int, list, Tensor, optional): the class whose
                        log-probability the task loss keeps; None = the class the
                        model predicts on the original input. For a single binary
                        logit, class 1 is "logit > 0". Default: None
            steps (int, optional): optimisation steps. Default: 500
            lr (float, optional): learning rate. Default: 0.1
            beta (float, optional): weight of the capacity (summed over H,
                        averaged over real tokens); None = ``10 / H``. Default: None
            samples (int, optional): noise draws per step (the loss is their
                        mean). Default: 1
            readout (str, optional): ``"alpha"`` (``sigmoid(alpha)``) or
                        ``"capacity"`` (bits summed over H). Default: ``"alpha"``
            optimizer (str, optional): ``"rmsprop"`` (centred) or ``"adam"``.
                        Default: ``"rmsprop"``
            verbose (bool, optional): tqdm progress bar. Default: True

        Returns:
            *Tensor* (B, T) (a 1-tuple when ``inputs`` is a tuple) of scores,
            higher = more important, 0 at padding.

        Raises:
            ValueError: no statistics for ``layer`` (run :meth:`fit_statistics`),
                        or a bad option (named in the message).
        """
        call = self._prepare(inputs, additional_forward_args, layer)
        check_choice(readout, _READOUTS, "readout")
        check_positive_int(samples, "samples")
        if beta is not None:
            check_non_negative(beta, "beta")
        states, original = self.capture(call)
        assert original is not None
        state = states[call.site]
        mean, std = self.noise_statistics(call.site, state)
        # on log-probabilities: a single binary logit is two classes here
        target_index = resolve_target(log_probs(original), target)
        assert target_index is not None
        alpha = torch.full(state.shape[:-1], 5.0, device=state.device, requires_grad=True)
        opt = make_optimizer(optimizer, alpha, lr)
        beta = 10.0 / state.shape[-1] if beta is None else float(beta)
        loss_fn = self._loss(call, state, (mean, std), alpha, target_index, beta, samples)
        with frozen(self.model):
            optimize(loss_fn, opt, steps, "PerSampleBottleneck", verbose)

        with torch.no_grad():
            scores = bottleneck_scores(alpha, state, mean, std, readout)
        return self._finish(scores, call)

    def _loss(
        self, call: PreparedCall, state: Tensor, statistics: Tuple[Tensor, Tensor], alpha: Tensor,
        target_index: Tensor, beta: float, samples: int,
    ) -> Callable[[int], Tensor]:
        r"""``loss(step)``: the task loss on ``samples`` noisy passes plus ``beta``
        times the capacity, summed over the batch."""
        mean, std = statistics
        real = call.mask.to(state.device).float()
        tokens = real.sum(-1).clamp(min=1.0)

        def loss_fn(step: int) -> Tensor:
            # lambda = 1 at padding: padded positions are never perturbed.
            lam = torch.where(call.mask, torch.sigmoid(alpha), torch.ones_like(alpha)).unsqueeze(-1)
            task = torch.zeros((), device=state.device)
            for _ in range(samples):
                z = noisy_state(state, lam, mean, std)
                log_q = log_probs(self.replaced_logits(call, {call.site: z}))
                task = task - log_q.gather(-1, target_index.unsqueeze(-1)).sum()
            capacity = (capacity_nats(alpha, state, mean, std).sum(-1) * real).sum(-1) / tokens
            return task / samples + beta * capacity.sum()

        return loss_fn
