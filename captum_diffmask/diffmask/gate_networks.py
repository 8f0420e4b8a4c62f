"""The gate networks of a DiffMask probe, evaluated together.

A probe has one small network per layer (input mode: the votes of each depth;
hidden mode: one per ``hidden.k``), each weight-normed ``[H/4, tanh, 1]``, ``10 tanh + b``
(b = 5 by default), features standardised from the first batch.
:class:`GateNetworks` evaluates any subset of them in one batched call (a
batched matrix product over the stacked weights) instead of one small network
after the other; networks that read the same features with the same
standardisation (input mode's votes of every depth on one ``hidden.j``) share one
standardised copy of them and one matrix product (``docs/architecture.md``, "The
gate networks are evaluated together")."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn, Tensor

#: What one gate network reads: a tensor (..., in_size), or tensors read side by side.
FeatureParts = Union[Tensor, Tuple[Tensor, ...]]

#: Sums a tensor over the processes of a distributed fit.
Reduce = Callable[[Tensor], Tensor]


def _stack(tensors: Sequence[Tensor]) -> Tensor:
    # One tensor: a view, no copy (nor a split in backward); the common case of a
    # training step in hidden mode.
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(list(tensors))


class _GateParameters(nn.Module):
    r"""The parameters of one gate network, ``[in, hidden, tanh, 1]`` with both linear
    layers weight-normalised (``w = g * v / ||v||`` per output unit). No forward:
    :class:`GateNetworks` stacks these to evaluate several networks at once."""

    def __init__(self, in_features: int, hidden_features: int, init_bias: float) -> None:
        super().__init__()
        # Drawn by nn.Linear so the initialisation (and its use of the random
        # stream) is torch's default for a linear layer, as before the networks
        # were stacked: same seed, same probe.
        first = nn.Linear(in_features, hidden_features)
        last = nn.Linear(hidden_features, 1)
        with torch.no_grad():
            # Stored (hidden, in) as nn.Linear does: the weight norm then reduces
            # over contiguous memory (over a strided dimension it is several times
            # slower on CPU).
            self.direction1 = nn.Parameter(first.weight.clone())
            # g starts at ||v||, as torch's weight_norm: w starts as nn.Linear drew it.
            self.gain1 = nn.Parameter(first.weight.norm(dim=1))
            self.bias1 = nn.Parameter(first.bias.clone())
            self.direction2 = nn.Parameter(last.weight[0].clone())
            # The last layer starts near zero, so that every gate starts at exactly
            # the bias (NN output ~ 0, tanh in its linear range): a random start
            # puts some gates at the saturated ends of the tanh, where they receive
            # no gradient for many steps.
            self.gain2 = nn.Parameter(torch.tensor(1e-3))
            self.bias2 = nn.Parameter(torch.tensor(0.0))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))


class GateNetworks(nn.Module):
    r"""
    N gate networks ``xi * tanh(NN_j(x)) + b_j`` with ``NN_j = [hidden, tanh, 1]``,
    evaluated together.

    The paper's parameterisation (its appendix on the probe): weight-normalised
    linear layers, the output bounded to ``(-xi, xi)`` for stability, and a
    learnable bias started at 5 so that gates start open (``P(z != 0) ~ 0.995``):
    a probe that starts by masking destroys the signal it must learn from.

    Any subset of the networks is evaluated in one call: their weights are stacked
    along a leading dimension and applied with batched matrix products, so the cost
    is a few large kernels instead of a dozen small ones per network. Networks of
    different input sizes share the call by zero-padding features and first-layer
    weights to the largest size; the padded weight rows are zeros that are not
    parameters, so they leave the weight norm and the gradients unchanged. Networks
    given the same feature tensors with the same standardisation (input mode's
    votes of every depth, :meth:`InputGateProbe.every_depth`) are evaluated on one
    standardised copy with one product instead: copying and standardising the
    features once per network cost more than the networks themselves.

    Each network's parameters stay separate leaf tensors (stacked on the fly, a
    copy of a few MB at most): a network that is not evaluated then has no gradient
    (``None``), and the optimiser leaves it and its state untouched, as when each
    network was its own module. One stacked parameter would instead give it a zero
    gradient, on which Adam keeps moving it by momentum and RMSprop decays its
    second-moment estimate.

    Args:

        in_sizes (sequence of int): size of the features each network reads.
        hidden_features (int): size of the hidden layer of every network.
        max_activation (float, optional): xi. Default: 10.0
        init_bias (float, optional): initial b. Default: 5.0
    """

    def __init__(
        self,
        in_sizes: Sequence[int],
        hidden_features: int,
        max_activation: float = 10.0,
        init_bias: float = 5.0,
    ) -> None:
        super().__init__()
        self.in_sizes = tuple(int(size) for size in in_sizes)
        if not self.in_sizes:
            raise ValueError("in_sizes must name at least one network")
        self.in_max = max(self.in_sizes)
        self.hidden_features = int(hidden_features)
        self.max_activation = float(max_activation)
        self.nets = nn.ModuleList(_GateParameters(size, self.hidden_features, init_bias) for size in self.in_sizes)
        # Feature standardisation, set from data by `standardize`: hidden states
        # of trained models have large, shifted activations that saturate the tanh.
        # Padded columns keep mean 0 and std 1, so padded features stay 0.
        self.register_buffer("feature_mean", torch.zeros(len(self.in_sizes), self.in_max))
        self.register_buffer("feature_std", torch.ones(len(self.in_sizes), self.in_max))
        #: networks -> (their parameters' versions, their stacked weights), kept
        #: between calls without gradients (:meth:`_weights`)
        self._held_weights: dict = {}

    def __len__(self) -> int:
        return len(self.in_sizes)

    @torch.no_grad()
    def standardize(
        self, network: Union[int, Sequence[int]], features: Tensor, mask: Tensor, reduce: Optional[Reduce] = None
    ) -> None:
        r"""
        Sets the feature mean and std of one network (or of several that read
        the same features) from data.

        Args:

            network (int or sequence of int): which network(s), 0..N-1.
            features (Tensor): (B, T, in_size) the features it reads.
            mask (Tensor): (B, T), 1 at the real tokens the statistics are taken over.
            reduce (Callable, optional): sums a tensor over processes (a fit under
                        ``torch.distributed``: the statistics of the global batch).
                        Default: None
        """
        rows = [network] if isinstance(network, int) else [int(n) for n in network]
        size = self.in_sizes[rows[0]]
        if any(self.in_sizes[n] != size for n in rows):
            raise ValueError(f"network: {rows} read features of different sizes")
        real = features.float()[mask.bool()]
        if reduce is not None:
            moments = reduce(torch.stack([real.sum(0), real.pow(2).sum(0), torch.full_like(real[0], len(real))]))
            mean = moments[0] / moments[2].clamp(min=1.0)
            self.feature_mean[rows, :size] = mean
            spread = (moments[1] / moments[2].clamp(min=1.0) - mean.pow(2)).clamp(min=0.0).sqrt()
            self.feature_std[rows, :size] = spread.clamp(min=1e-4) if float(moments[2][0]) > 1 else 1.0
            return
        self.feature_mean[rows, :size] = real.mean(0)
        self.feature_std[rows, :size] = (
            real.std(0, unbiased=False).clamp(min=1e-4) if len(real) > 1 else 1.0
        )

    def _stacked(self, networks: Sequence[int], name: str) -> Tensor:
        r"""The parameter ``name`` of each of ``networks``, stacked: (n, ...)."""
        return _stack([getattr(self.nets[j], name) for j in networks])

    def _rows(self, buffer: Tensor, networks: Sequence[int], width: int) -> Tensor:
        r"""Rows ``networks`` of a (N, in_max) buffer, first ``width`` columns: (n, 1, width).
        A view when the networks are consecutive, as they are for every probe call."""
        first = networks[0]
        if list(networks) == list(range(first, first + len(networks))):
            return buffer[first : first + len(networks), None, :width]
        return buffer[torch.tensor(networks, device=buffer.device), None, :width]

    def _stacked_features(
        self, features: Sequence[FeatureParts], networks: Sequence[int], width: int
    ) -> Tuple[Tensor, bool]:
        r"""(n, M, width) float32: network i's parts side by side in row i, zeros after
        them. Written straight into one buffer: a ``torch.cat`` per network and then
        a ``torch.stack`` would copy every feature twice. Also says whether the
        tensor is a new buffer (False: a view of the caller's one tensor)."""
        parts = [list(f) if isinstance(f, (list, tuple)) else [f] for f in features]
        lead = parts[0][0].shape[:-1]
        for j, pieces in zip(networks, parts):
            size = sum(piece.shape[-1] for piece in pieces)
            if any(piece.shape[:-1] != lead for piece in pieces) or size != self.in_sizes[j]:
                shapes = [tuple(piece.shape) for piece in pieces]
                raise ValueError(
                    f"features: network {j} reads (..., {self.in_sizes[j]}) with leading shape "
                    f"{tuple(lead)}, got {shapes[0] if len(shapes) == 1 else shapes}"
                )
        rows = lead.numel()
        if len(parts) == 1 and len(parts[0]) == 1 and self.in_sizes[networks[0]] == width:
            return parts[0][0].reshape(1, rows, width).float(), False  # one network: no copy
        padded = any(self.in_sizes[j] < width for j in networks)
        make = torch.zeros if padded else torch.empty
        x = make(len(networks), rows, width, device=parts[0][0].device, dtype=torch.float32)
        for i, pieces in enumerate(parts):
            offset = 0
            for piece in pieces:
                x[i, :, offset : offset + piece.shape[-1]] = piece.reshape(rows, -1)
                offset += piece.shape[-1]
        return x, True

    def forward(self, features: Sequence[FeatureParts], networks: Optional[Sequence[int]] = None) -> Tensor:
        r"""
        Evaluates the networks ``networks`` on their features, in one batched call
        (or one product per group of networks that read the same tensors).

        Args:

            features (sequence of Tensor or of tuples of Tensor): one entry per
                        evaluated network: its features (..., in_size of that
                        network), or a tuple of tensors (..., H_a), (..., H_b), ...
                        that it reads side by side (``torch.cat`` along the last
                        dimension, without the copy). Every tensor has the same
                        leading shape.
            networks (sequence of int, optional): the networks evaluated, in the
                        order of ``features``; ``0 .. len(features) - 1`` when None.
                        Default: None

        Returns:
            *Tensor* (..., len(networks)) of gate logits in ``(b - xi, b + xi)``,
            float32.
        """
        networks = list(range(len(features))) if networks is None else [int(j) for j in networks]
        if len(networks) != len(features) or not networks:
            raise ValueError(f"features: expected one entry per network, got {len(features)} for {len(networks)}")
        first = features[0][0] if isinstance(features[0], (list, tuple)) else features[0]
        lead = first.shape[:-1]
        groups = self._shared_feature_groups(features, networks)
        if len(groups) < len(networks):
            return self._grouped(features, networks, groups).reshape(*lead, len(networks))
        return self._batched(features, networks).t().reshape(*lead, len(networks))

    def _shared_feature_groups(self, features: Sequence[FeatureParts], networks: Sequence[int]) -> List[List[int]]:
        r"""The positions of ``networks`` grouped by the features they read: the
        same tensors (by identity) and the same standardisation, as the votes of
        every depth that read one ``hidden.j`` (:meth:`InputGateProbe.every_depth`)."""
        groups: dict = {}
        for position, (parts, j) in enumerate(zip(features, networks)):
            key = tuple(id(t) for t in (parts if isinstance(parts, (list, tuple)) else [parts]))
            members = groups.setdefault(key, [[]])
            for group in members:  # the same tensors, but a standardisation of its own: a group apart
                if not group or self._same_standardisation(networks[group[0]], j):
                    group.append(position)
                    break
            else:
                members.append([position])
        return [group for members in groups.values() for group in members]

    def _same_standardisation(self, a: int, b: int) -> bool:
        return (self.in_sizes[a] == self.in_sizes[b] and torch.equal(self.feature_mean[a], self.feature_mean[b])
                and torch.equal(self.feature_std[a], self.feature_std[b]))

    def _grouped(self, features: Sequence[FeatureParts], networks: Sequence[int], groups: List[List[int]]) -> Tensor:
        r"""(M, n) logits, the networks of each group evaluated on one standardised
        copy of their shared features with one matrix product: the features are
        neither copied nor standardised once per network."""
        columns, order = [], []
        for group in groups:
            nets = [networks[i] for i in group]
            x = self._standardized(features[group[0]], nets[0])  # (M, size)
            columns.append(self._shared_input_logits(x, nets))
            order.extend(group)
        logits = torch.cat(columns, dim=1)
        inverse = torch.empty(len(order), dtype=torch.long, device=logits.device)
        inverse[torch.tensor(order, device=logits.device)] = torch.arange(len(order), device=logits.device)
        return logits[:, inverse]

    def _standardized(self, features: FeatureParts, network: int) -> Tensor:
        r"""(M, size) float32: the features ``network`` reads, its parts side by
        side, standardised by its statistics; each part is written standardised
        into one buffer (no copy of it first)."""
        size = self.in_sizes[network]
        mean, std = self.feature_mean[network, :size], self.feature_std[network, :size]
        parts = list(features) if isinstance(features, (list, tuple)) else [features]
        lead = parts[0].shape[:-1]
        if sum(part.shape[-1] for part in parts) != size or any(part.shape[:-1] != lead for part in parts):
            shapes = [tuple(part.shape) for part in parts]
            raise ValueError(f"features: network {network} reads (..., {size}) with leading shape {tuple(lead)}, "
                             f"got {shapes[0] if len(shapes) == 1 else shapes}")
        rows = lead.numel()
        if len(parts) == 1:
            return (parts[0].reshape(rows, size).float() - mean) / std
        x = torch.empty(rows, size, device=parts[0].device, dtype=torch.float32)
        offset = 0
        for part in parts:
            width = part.shape[-1]
            torch.sub(part.reshape(rows, width).float(), mean[offset : offset + width], out=x[:, offset : offset + width])
            offset += width
        return x.div_(std)

    def _shared_input_logits(self, x: Tensor, networks: Sequence[int]) -> Tensor:
        r"""(M, n) logits of ``networks`` (one input size) on the same standardised
        (M, size) features: the first layers of all of them as one (M, size) x
        (size, n * hidden) product."""
        n, hidden = len(networks), self.hidden_features
        w1, b1, w2, b2, bias = self._weights(networks, x.shape[-1])
        h = torch.tanh(torch.addmm(b1, x, w1.t())).view(-1, n, hidden)
        out = torch.einsum("mnh,nh->mn", h, w2) + b2
        return self.max_activation * torch.tanh(out) + bias

    def _weights(self, networks: Sequence[int], size: int) -> Tuple[Tensor, ...]:
        r"""The weight-normed layers of ``networks`` stacked: (n * hidden, size),
        (n * hidden,), (n, hidden), (n,), (n,). Without gradients (an attribution)
        they are kept while no parameter of these networks changes: stacking and
        normalising 28 networks' weights on every call cost a few percent of a
        forward pass, for the same tensors."""
        key = tuple(networks)
        params = [p for j in networks for p in self.nets[j].parameters()]
        versions = tuple((id(p), p._version, p.data_ptr()) for p in params)  # a move or an update: anew
        held = self._held_weights.get(key) if not torch.is_grad_enabled() else None
        if held is not None and held[0] == versions:
            return held[1]
        n, hidden = len(networks), self.hidden_features
        v1 = _stack([self.nets[j].direction1 for j in networks]).view(n * hidden, size)
        w1 = torch._weight_norm(v1, self._stacked(networks, "gain1").view(n * hidden, 1), 0)
        w2 = torch._weight_norm(self._stacked(networks, "direction2"), self._stacked(networks, "gain2").view(n, 1), 0)
        weights = (w1, self._stacked(networks, "bias1").view(n * hidden), w2, self._stacked(networks, "bias2"),
                   self._stacked(networks, "bias"))
        if not torch.is_grad_enabled():
            self._held_weights[key] = (versions, weights)
        return weights

    def _batched(self, features: Sequence[FeatureParts], networks: Sequence[int]) -> Tensor:
        r"""(n, M) logits, each network on its own features, in batched products
        over the networks stacked (zero-padded to the widest)."""
        width = max(self.in_sizes[j] for j in networks)
        x, fresh = self._stacked_features(features, networks, width)  # (n, M, width)
        mean, std = self._rows(self.feature_mean, networks, width), self._rows(self.feature_std, networks, width)
        # In place on a new buffer (neither op needs its input for backward); never
        # on a view of the caller's state.
        x = x.sub_(mean).div_(std) if fresh else (x - mean) / std

        # Weight norm per output unit, w = g * v / ||v||, with the kernel of torch's
        # weight_norm(dim=0) on nn.Linear (fused, forward and backward): every row
        # of the stack is one output unit, and the zero padding leaves its norm as is.
        n, hidden = len(networks), self.hidden_features
        v1 = _stack([self._padded_direction(j, width) for j in networks])  # (n, hidden, width)
        w1 = torch._weight_norm(v1.view(n * hidden, width), self._stacked(networks, "gain1").view(n * hidden, 1), 0)
        w1 = w1.view(n, hidden, width)
        h = torch.tanh(torch.baddbmm(self._stacked(networks, "bias1").unsqueeze(1), x, w1.transpose(1, 2)))  # (n, M, hidden)
        w2 = torch._weight_norm(self._stacked(networks, "direction2"), self._stacked(networks, "gain2").view(n, 1), 0)
        # w2 as the left factor, (n, 1, hidden) @ (n, hidden, M): on CPU a batched
        # product with a single output column, h @ w2, is ten times slower.
        out = torch.baddbmm(self._stacked(networks, "bias2")[:, None, None], w2.unsqueeze(1), h.transpose(1, 2))
        out = out.squeeze(1)  # (n, M)
        return self.max_activation * torch.tanh(out) + self._stacked(networks, "bias").unsqueeze(1)  # (n, M)

    def _padded_direction(self, network: int, width: int) -> Tensor:
        direction = self.nets[network].direction1
        missing = width - self.in_sizes[network]
        return F.pad(direction, (0, missing)) if missing else direction
