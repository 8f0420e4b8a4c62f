"""The Readout Bottleneck of Schulz, Sixt, Tombari and Landgraf (ICLR 2020),
"Restricting the Flow: Information Bottlenecks for Attribution", Sec. 3.2, on the
token states of a site.

The Per-Sample Bottleneck optimises its noise weights anew for every example. The
Readout Bottleneck learns them once: a small network reads, at every position, the
states of several layers (recorded in a first pass over the unchanged model) and
predicts the bottleneck's parameters there; it is trained on a data set with the
same objective (the task loss plus ``beta`` times the information that flows), and
attributes in one pass. It is the bottleneck's counterpart of amortised DiffMask.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor
from tqdm.auto import tqdm

from captum_diffmask.methods.bottleneck import bottleneck_scores, capacity_nats, GaussianBottleneck, noisy_state
from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import (
    check_layer, ForwardFunc, InputType, PaddingMaskArg, PreparedCall, resolve_target, site_for_layer,
)
from captum_diffmask.model.attribution import attribution_call, SitesType
from captum_diffmask.model.checks import check_choice, check_non_negative, check_positive_int
from captum_diffmask.model.divergences import log_probs
from captum_diffmask.model.forward import Batch, frozen
from captum_diffmask.model.rng import preserved_rng

_GRANULARITIES = ("element", "token")
_TARGETS = ("sampled", "predicted")
_READOUTS = ("capacity", "alpha")
#: IBA's bound on the predicted alpha (lambda between sigmoid(-5) and sigmoid(5)).
ALPHA_BOUND = 5.0
#: The width of the learned target embedding the readout network reads.
TARGET_DIM = 32
#: The share of elements clamped shut in the last epoch beyond which a fit warns
#: that the network collapsed.
COLLAPSED = 0.99


def _accumulate(sums: Dict[str, float], terms: Dict[str, Tensor]) -> None:
    r"""Adds one batch's objective terms to the running ``sums``."""
    for key, value in terms.items():
        sums[key] = sums.get(key, 0.0) + float(value.detach())


class ReadoutNetwork(nn.Module):
    r"""
    Per position, the normalised states of the readout sites (and, for a model
    with one distribution over a fixed set of classes, a learned embedding of the
    target class) mapped to the bottleneck's ``alpha``.

    IBA's three 1x1 convolutions, which on tokens are linear maps applied at each
    position: ``features -> features / 2 -> 2 * out -> out`` with ReLUs between;
    the last layer starts with weights scaled by 1e-3 and bias 5, so that nearly
    everything flows at the start, and ``alpha`` is clamped to [-5, 5] (IBA's bound).

    Args:

        features (int): F, the width of the concatenated readout states.
        out (int): 1 (one alpha per token) or H (one per element of the state).
        classes (int, optional): the number of target classes the network reads
                    (None: it reads no target). Default: None
    """

    def __init__(self, features: int, out: int, classes: Optional[int] = None) -> None:
        super().__init__()
        self.target_embedding = nn.Embedding(classes, TARGET_DIM) if classes else None
        width = features + (TARGET_DIM if classes else 0)
        self.layers = nn.Sequential(
            nn.Linear(width, max(width // 2, 1)), nn.ReLU(),
            nn.Linear(max(width // 2, 1), 2 * out), nn.ReLU(),
            nn.Linear(2 * out, out),
        )
        last = self.layers[-1]
        with torch.no_grad():
            last.weight.mul_(1e-3)
            last.bias.fill_(ALPHA_BOUND)

    def forward(self, features: Tensor, target: Optional[Tensor] = None) -> Tensor:
        r"""
        Args:

            features (Tensor): (B, T, F) normalised readout states.
            target (Tensor, optional): (B,) long target classes; required when
                        the network reads a target. Default: None

        Returns:
            *Tensor* (B, T, out) alpha in [-5, 5].
        """
        if self.target_embedding is not None:
            assert target is not None
            embedded = self.target_embedding(target).unsqueeze(1).expand(-1, features.shape[1], -1)
            features = torch.cat([features, embedded], dim=-1)
        # IBA's clamp: past the bound an element has no gradient; a network that
        # drives every alpha there stays (at lr >= 3e-3 on the toy task)
        return self.layers(features).clamp(-ALPHA_BOUND, ALPHA_BOUND)


@register_method
class ReadoutBottleneck(GaussianBottleneck):
    r"""
    Readout Bottleneck (Schulz et al., ICLR 2020, Sec. 3.2) at the token level:
    the Per-Sample Bottleneck's noise weights predicted by a network trained once
    on data, so that attribution is one pass.

    **Bottleneck.** At the site of ``layer``, with ``lambda = sigmoid(alpha)``::

        z = lambda * h + (1 - lambda) * eps,    eps ~ N(mu, std^2)

    (``mu``, ``std`` per hidden dimension over the data's real tokens), where
    ``alpha`` has one value per element of the state (``granularity="element"``,
    IBA's default) or per token (``"token"``, as the Per-Sample Bottleneck here).

    **Readout.** A first pass without gradients records the states of the
    readout sites (default: every site, the input embeddings to the last block,
    so also the layers after the bottleneck); each is normalised with its own
    data mean and std and they are concatenated per position
    (:class:`ReadoutNetwork`). IBA resizes image feature maps to the
    bottleneck's resolution; token sites all have the same positions, so there
    is nothing to resize. IBA also reads the classifier's output; here the
    network reads the *target* instead, as a learned embedding of the class, so
    that ``target`` selects what is attributed (for a model with one
    distribution over a fixed set of classes; a model with per-position
    distributions or spans gets a readout without a target, and ``target``
    must then be None).

    **Training** (:meth:`fit`): the readout network alone is trained (the model
    is frozen) on::

        -log q(c | z) + beta * (1 / n) * sum_{real t} sum_H KL(N(lambda r, (1 - lambda)^2) || N(0, 1))

    with ``r = (h - mu) / std``, ``n`` the example's real tokens and ``c`` the
    target: drawn from the model's own output distribution on the unchanged
    input when the network reads a target (so it learns every class in
    proportion to how likely the model finds it), else the predicted class.
    ``beta = 10 / H`` by default: IBA's "beta 10 on the mean" over elements,
    the convention of :class:`PerSampleBottleneck`. IBA trains with Adam at lr
    1e-5 for 10 epochs over ImageNet (about 400 000 steps); on the smaller data
    sets here the default is Adam at lr 1e-3 for 10 epochs.

    **Scores.** ``readout="capacity"`` (default): the information that flows
    through each token, in bits summed over H (IBA's heatmap); ``"alpha"``:
    ``sigmoid(alpha)`` averaged over H, the share that flows. Higher = more
    important, 0 at padding.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`~captum_diffmask.model.attribution.SiteAttribution`.

    Examples::

        >>> bottleneck = ReadoutBottleneck(model)
        >>> history = bottleneck.fit(train_loader, layers=[3], epochs=2)  # one row per epoch
        >>> bits = bottleneck.attribute(ids, additional_forward_args=(mask,), layer=3)
        >>> flowing = bottleneck.attribute(ids, additional_forward_args=(mask,), layer=3, readout="alpha")
    """

    summary = "Schulz et al. 2020, a network reading every layer predicts the bottleneck"
    data_step = "fit"

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output)
        #: ``{layer: network}``, set by :meth:`fit`.
        self.networks: Dict[int, ReadoutNetwork] = {}
        #: ``{layer: readout site names}``, in the order the network reads them.
        self.readout_sites: Dict[int, List[str]] = {}

    def is_prepared(self, layer: Optional[int]) -> bool:
        r"""Whether a readout network is fitted for ``layer``."""
        return layer in self.networks

    def prepare_on_data(
        self, train_data: Iterable[Batch], layer: Optional[int], options: Dict[str, Any], seed: int = 0,
        verbose: bool = False, max_steps: Optional[int] = None,
    ) -> Dict[str, Any]:
        r"""Fits the readout network of ``layer`` (:meth:`fit` with ``options``)."""
        if layer is None:
            raise ValueError("layer: ReadoutBottleneck attributes one layer at a time, got None")
        chosen = {"seed": seed, "verbose": verbose, **options}
        if max_steps is not None:
            chosen.setdefault("max_steps", max_steps)
        history = self.fit(train_data, layers=[layer], **chosen)
        return {"fit_steps": int(sum(row["steps"] for row in history)), "fit_last": history[-1] if history else {}}

    def fit(
        self,
        train_data: Iterable[Batch],
        layers: Optional[Sequence[int]] = None,
        granularity: str = "element",
        target: str = "sampled",
        readout_sites: Optional[Sequence[str]] = None,
        epochs: int = 10,
        lr: float = 1e-3,
        beta: Optional[float] = None,
        min_std: float = 0.01,
        statistics_batches: Optional[int] = None,
        max_steps: Optional[int] = None,
        seed: int = 0,
        verbose: bool = True,
        layer: Optional[int] = None,
    ) -> List[Dict[str, float]]:
        r"""
        Estimates the sites' statistics and trains a readout network for each of
        ``layers``, one after the other (the contract of :meth:`DiffMask.fit`).

        Args:

            train_data (iterable): batches as :meth:`DiffMask.fit` takes them,
                        iterated once per epoch (and once for the statistics).
            layers (sequence of int, optional): the layers fitted, 0 for the
                        ``input`` site, k for ``hidden.k``; every layer when None.
                        Default: None
            granularity (str, optional): ``"element"`` (one alpha per element of
                        the state, IBA's) or ``"token"``. Default: ``"element"``
            target (str, optional): what the network is trained to keep:
                        ``"sampled"``: it reads a target class (a learned
                        embedding) and is trained on classes drawn from the
                        model's own distribution, so that ``attribute`` takes a
                        ``target``; ``"predicted"``: it reads no target and is
                        trained on the model's prediction, the class ``attribute``
                        explains by default (a network that reads the target can
                        steer the noisy output toward it instead of keeping what
                        the model uses). Default: ``"sampled"``
            readout_sites (sequence of str, optional): the sites the network
                        reads; None: every site. Default: None
            epochs (int, optional): passes over ``train_data``. Default: 10
            lr (float, optional): Adam's learning rate. Default: 1e-3
            beta (float, optional): weight of the capacity (summed over H,
                        averaged over real tokens); None = ``10 / H``. Default: None
            min_std (float, optional): floor of every site's std. Default: 0.01
            statistics_batches (int, optional): batches read for the statistics
                        (None: all). Default: None
            max_steps (int, optional): stop after this many training steps.
                        Default: None
            seed (int, optional): seeds the network's initialisation and the
                        noise (the caller's RNG is left as found). Default: 0
            verbose (bool, optional): a progress bar per epoch. Default: True
            layer (int, optional): release 0.1's one layer: ``layers=[layer]``,
                        with a ``DeprecationWarning``. Default: None

        Returns:
            *list* of one dict per (layer, epoch): ``layer``, ``epoch``, ``steps``, ``loss``, ``task``
            (the mean negative log-likelihood of the target), ``capacity``
            (mean bits per real token), ``shut`` (the share of real elements
            clamped at alpha = -5) and ``agreement`` (the share of examples
            whose noisy pass keeps the model's prediction), means over the
            epoch's batches. A fit whose
            last epoch has more than 99 % shut warns that the network collapsed.
        """
        chosen = self._fitted_layers(layers, layer)
        check_choice(granularity, _GRANULARITIES, "granularity")
        check_choice(target, _TARGETS, "target")
        check_positive_int(epochs, "epochs")
        check_positive_int(max_steps, "max_steps", allow_none=True)
        if beta is not None:
            check_non_negative(beta, "beta")
        sites = self._check_readout_sites(readout_sites)
        history: List[Dict[str, float]] = []
        for k in chosen:
            with preserved_rng(seed), frozen(self.model):
                wanted = [s for s in dict.fromkeys(sites + [site_for_layer(k, self.num_layers)])
                          if s not in self.statistics]
                if wanted:
                    self.estimate_statistics(train_data, k, wanted, min_std, statistics_batches)
                rows = self._train(train_data, k, sites, (granularity, target), (epochs, lr, beta, max_steps), verbose)
            history += [{"layer": k, **row} for row in rows]
        return history

    def _fitted_layers(self, layers: Optional[Sequence[int]], layer: Optional[int]) -> List[int]:
        r"""``layers`` checked (every layer when None), or release 0.1's ``layer``."""
        if layer is not None:
            if layers is not None:
                raise ValueError("give layers=[...] or the deprecated layer=, not both")
            warnings.warn("ReadoutBottleneck.fit(layer=k) is fit(layers=[k]), the contract of DiffMask.fit; "
                          "layer= goes with the next release", DeprecationWarning, stacklevel=3)
            layers = [layer]
        if layers is None:
            return list(range(self.num_layers + 1))
        if isinstance(layers, int) or not list(layers):
            raise ValueError(f"layers must be a non-empty sequence of layers in 0..{self.num_layers}, got {layers!r}")
        return [check_layer(k, self.num_layers) for k in layers]

    def evaluate(
        self, data: Iterable[Batch], layer: int, beta: Optional[float] = None, seed: int = 0,
    ) -> Dict[str, float]:
        r"""
        The training objective of the fitted network of ``layer`` on ``data``,
        without training: for choosing ``lr``, ``beta`` or ``epochs`` on
        sentences the fit did not see.

        Args:

            data (iterable): batches as :meth:`fit` takes them.
            layer (int): a layer :meth:`fit` has fitted.
            beta (float, optional): the capacity's weight in ``loss``, as in
                        :meth:`fit`; None = ``10 / H``. Default: None
            seed (int, optional): seeds the noise and the sampled targets (the
                        caller's RNG is left as found). Default: 0

        Returns:
            *dict* with ``steps`` (batches read), ``loss``, ``task``, ``capacity``,
            ``shut`` and ``agreement``, means over the batches, as one epoch of
            :meth:`fit`'s history.
        """
        if layer not in self.networks:
            raise ValueError(f"layer: no readout network is fitted for layer {layer}; fitted: {sorted(self.networks)}")
        if beta is not None:
            check_non_negative(beta, "beta")
        network, sites = self.networks[layer], self.readout_sites[layer]
        sums: Dict[str, float] = {}
        count = 0
        with preserved_rng(seed), frozen(self.model), torch.no_grad():
            for batch in data:
                call = self.prepare_batch(batch, layer, "data batch")
                states, original = self._read(call, sites)
                terms = self._objective(call, states, network, sites, self._training_target(network, original), beta,
                                        original)
                _accumulate(sums, terms)
                count += 1
        if not count:
            raise ValueError("data gave no batch to evaluate the readout network on")
        return {"steps": count, **{k: v / count for k, v in sums.items()}}

    def _check_readout_sites(self, readout_sites: Optional[Sequence[str]]) -> List[str]:
        names = list(self.locator.names)
        if readout_sites is None:
            return names
        chosen = [readout_sites] if isinstance(readout_sites, str) else list(readout_sites)
        unknown = [s for s in chosen if s not in names]
        if not chosen or unknown:
            raise ValueError(f"readout_sites must be a non-empty list of {names}, got {readout_sites!r}")
        return chosen

    def _train(
        self, train_data: Iterable[Batch], layer: int, sites: List[str], shape: Tuple[str, str],
        schedule: Tuple[int, float, Optional[float], Optional[int]], verbose: bool,
    ) -> List[Dict[str, float]]:
        r"""The training epochs of :meth:`fit` (statistics in place); ``shape``:
        its ``granularity`` and ``target``."""
        epochs, lr, beta, max_steps = schedule
        network: Optional[ReadoutNetwork] = None
        optimizer: Optional[torch.optim.Optimizer] = None
        history: List[Dict[str, float]] = []
        steps = 0
        for epoch in range(epochs):
            sums: Dict[str, float] = {}
            count = 0
            for batch in tqdm(train_data, desc=f"ReadoutBottleneck epoch {epoch + 1}", leave=False,
                              disable=None if verbose else True):
                if max_steps is not None and steps >= max_steps:
                    break
                call = self.prepare_batch(batch, layer, "train_data batch")
                states, original = self._read(call, sites)
                if network is None:
                    network = self._new_network(states, sites, call.site, shape, original)
                    optimizer = torch.optim.Adam(network.parameters(), lr=lr)
                    self.networks[layer], self.readout_sites[layer] = network, sites
                assert optimizer is not None
                target = self._training_target(network, original)
                terms = self._objective(call, states, network, sites, target, beta, original)
                optimizer.zero_grad(set_to_none=True)
                terms["loss"].backward()
                optimizer.step()
                _accumulate(sums, terms)
                count += 1
                steps += 1
            if count:
                history.append({"epoch": epoch + 1, "steps": count, **{k: v / count for k, v in sums.items()}})
            if max_steps is not None and steps >= max_steps:
                break
        if network is None:
            raise ValueError("train_data gave no batch to train the readout network on")
        network.eval()
        if history and history[-1]["shut"] > COLLAPSED:
            warnings.warn(
                f"ReadoutBottleneck.fit(layer={layer}): the network collapsed: {100 * history[-1]['shut']:.1f} % of "
                f"the elements sit at alpha = -{ALPHA_BOUND:g}, where no information flows and the clamp passes no "
                "gradient, so they cannot reopen; its scores rank the states, not what the output needs. "
                "Fit again with a lower lr (or beta).", UserWarning, stacklevel=3)
        return history

    def _read(self, call: PreparedCall, sites: List[str]) -> Tuple[Dict[str, Tensor], Tensor]:
        r"""The first pass: the readout sites' and the bottleneck's states, and the logits."""
        states, original = self.capture(call, list(dict.fromkeys(sites + [call.site])))
        assert original is not None
        return states, original

    def _new_network(
        self, states: Dict[str, Tensor], sites: List[str], site: str, shape: Tuple[str, str], original: Tensor,
    ) -> ReadoutNetwork:
        granularity, target = shape
        features = sum(states[s].shape[-1] for s in sites)
        out = states[site].shape[-1] if granularity == "element" else 1
        log_q = log_probs(original)
        one_distribution = log_q.dim() == 2 and self.model_forward.output in ("classes", "last")
        classes = log_q.shape[-1] if one_distribution and target == "sampled" else None
        return ReadoutNetwork(features, out, classes).to(states[site].device)

    @staticmethod
    def _training_target(network: ReadoutNetwork, original: Tensor) -> Tensor:
        r"""The class each example is trained on: drawn from the model's own
        distribution when the network reads a target, else the predicted one."""
        log_q = log_probs(original)
        if network.target_embedding is None:
            return log_q.argmax(-1)
        return torch.multinomial(log_q.exp(), 1).squeeze(-1)

    def _alpha(self, network: ReadoutNetwork, states: Dict[str, Tensor], sites: List[str],
               target: Optional[Tensor]) -> Tensor:
        r"""(B, T, out) alpha from the normalised readout states."""
        statistics = [self.noise_statistics(s, states[s]) for s in sites]
        features = [(states[s].float() - mean) / std for s, (mean, std) in zip(sites, statistics)]
        return network(torch.cat(features, dim=-1), target if network.target_embedding is not None else None)

    def _objective(
        self, call: PreparedCall, states: Dict[str, Tensor], network: ReadoutNetwork, sites: List[str],
        target: Tensor, beta: Optional[float], original: Tensor,
    ) -> Dict[str, Tensor]:
        r"""The training loss of one batch (a mean over its examples) and its terms."""
        state = states[call.site]
        mean, std = self.noise_statistics(call.site, state)
        alpha = self._alpha(network, states, sites, target)
        real = call.mask.to(state.device).unsqueeze(-1)
        # padding is never perturbed and carries no information cost
        lam = torch.where(real, torch.sigmoid(alpha), torch.ones_like(alpha))
        log_q = log_probs(self.replaced_logits(call, {call.site: noisy_state(state, lam, mean, std)}))
        task = -log_q.gather(-1, target.unsqueeze(-1)).reshape(log_q.shape[0], -1).sum(-1).mean()
        tokens = real.squeeze(-1).float().sum(-1).clamp(min=1.0)
        capacity = (capacity_nats(alpha, state, mean, std).sum(-1) * real.squeeze(-1)).sum(-1) / tokens
        weight = 10.0 / state.shape[-1] if beta is None else float(beta)
        loss = task + weight * capacity.mean()
        bits = capacity.mean() / math.log(2.0)
        # the share of real elements clamped shut, where the clamp passes no gradient
        shut = ((alpha <= -ALPHA_BOUND) & real).float().sum() / (real.float().sum() * alpha.shape[-1]).clamp(min=1.0)
        # does the noisy pass keep the model's prediction: what the bottleneck lets through is what the output uses
        kept = (log_q.detach().argmax(-1) == log_probs(original).argmax(-1)).float().mean()
        return {"loss": loss, "task": task.detach(), "capacity": bits.detach(), "shut": shut.detach(), "agreement": kept}

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: int = 0,
        readout: str = "capacity",
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        One pass records the readout sites, the network predicts the
        bottleneck, and its scores are read.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`);
                        :meth:`fit` must have run for ``layer``.
            target (int, list, Tensor, optional): the class the network is asked
                        about; None = the class the model predicts. Must be None
                        for a readout without a target (per-position or span
                        outputs). For a single binary logit, class 1 is
                        "logit > 0". Default: None
            readout (str, optional): ``"capacity"`` (bits summed over H) or
                        ``"alpha"`` (``sigmoid(alpha)`` averaged over H).
                        Default: ``"capacity"``

        Returns:
            *Tensor* (B, T) (a 1-tuple when ``inputs`` is a tuple) of scores,
            higher = more important, 0 at padding.

        Raises:
            ValueError: no network for ``layer`` (run :meth:`fit`), a target for
                        a readout without one, or a bad option (named).
        """
        call = self._prepare(inputs, additional_forward_args, layer)
        check_choice(readout, _READOUTS, "readout")
        if layer not in self.networks:
            raise ValueError(f"layer: no readout network for layer {layer}; call fit(train_data, layer={layer}) first")
        network, sites = self.networks[layer], self.readout_sites[layer]
        if network.target_embedding is None and target is not None:
            raise ValueError("target must be None: this readout network reads no target (the model's output "
                             "is not one distribution over a fixed set of classes)")
        states, original = self._read(call, sites)
        index = resolve_target(log_probs(original), target) if network.target_embedding is not None else None
        mean, std = self.noise_statistics(call.site, states[call.site])
        with torch.no_grad():
            alpha = self._alpha(network, states, sites, index)
            scores = bottleneck_scores(alpha, states[call.site], mean, std, readout)
        return self._finish(scores, call)
