"""The probe of DiffMask's component modes: per input, a gate on each attention
head or MLP unit of each block, read from the block's input.

Block k (whose output is ``hidden.k``) is gated from ``hidden.{k-1}``, the states
it reads: each position's state standardised (by the fit's first batch), averaged
over the input's real positions, and mapped by a small network
``[H, hidden, tanh, count]`` to one logit per component, ``xi * tanh(NN(x)) + b``
as the token probes' gate networks (:class:`~captum_diffmask.diffmask.gate_networks.GateNetworks`),
with a bias per component started at ``init_bias`` so that every component starts
kept. A closed component is replaced by its learned baseline, started at its mean
activation over the first batch's real positions (mean ablation).

``per_task=True`` keeps the biases alone: one mask for every input, fitted on the
whole data set (Subnetwork Probing, Cao et al. 2021), the non-amortised variant.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.probes import masked_mean, Reduce


class _BlockGates(nn.Module):
    r"""One block's gate network, ``xi * tanh(NN(x)) + b`` with ``NN = [hidden, tanh, count]``."""

    def __init__(self, in_features: int, hidden_features: int, count: int, init_bias: float) -> None:
        super().__init__()
        self.first = nn.Linear(in_features, hidden_features)
        self.last = nn.Linear(hidden_features, count)
        with torch.no_grad():
            # the output starts near zero, so every gate starts at the bias (as the token probes')
            self.last.weight.mul_(1e-3)
            self.last.bias.zero_()
        self.bias = nn.Parameter(torch.full((count,), float(init_bias)))


class ComponentGateProbe(nn.Module):
    r"""
    Gates on the heads (or units) of blocks 1..L, per input, and their baselines.

    Args:

        in_sizes (sequence of int): H of ``hidden.0 .. hidden.{L-1}``, the
                    inputs of blocks 1..L.
        counts (sequence of int): components per block.
        widths (sequence of int): features per component (a head's dimension;
                    1 for a unit).
        hidden_features (int): hidden layer size of each block's network.
        init_bias (float, optional): the gates' initial bias b. Default: 5.0
        max_activation (float, optional): xi. Default: 10.0
        per_task (bool, optional): the biases alone, one mask for every input
                    (no network reads the input). Default: False
    """

    def __init__(
        self, in_sizes: Sequence[int], counts: Sequence[int], widths: Sequence[int], hidden_features: int,
        init_bias: float = 5.0, max_activation: float = 10.0, per_task: bool = False,
    ) -> None:
        super().__init__()
        if not len(in_sizes) == len(counts) == len(widths) or not in_sizes:
            raise ValueError(f"in_sizes, counts and widths must name the same blocks, got {len(in_sizes)}, "
                             f"{len(counts)} and {len(widths)}")
        self.max_activation = float(max_activation)
        self.per_task = bool(per_task)
        self.nets = nn.ModuleList(_BlockGates(h, hidden_features, c, init_bias) for h, c in zip(in_sizes, counts))
        if self.per_task:  # the biases alone: no parameter the fit would leave untrained
            for net in self.nets:
                del net.first, net.last
        self.baselines = nn.ParameterList(nn.Parameter(torch.zeros(c, w)) for c, w in zip(counts, widths))
        for k, size in enumerate(in_sizes):
            self.register_buffer(f"feature_mean_{k}", torch.zeros(size))
            self.register_buffer(f"feature_std_{k}", torch.ones(size))

    @property
    def counts(self) -> Sequence[int]:
        return [int(b.shape[0]) for b in self.baselines]

    @torch.no_grad()
    def init_baselines(self, states: Dict[str, Tensor], components: Dict[str, Tensor], mask: Tensor,
                       reduce: Optional[Reduce] = None) -> None:
        r"""
        Standardises each block's features and starts its baselines at the mean
        components, over the real positions of a batch.

        Args:

            states (dict): ``hidden.{k-1}`` -> (B, T, H) for every block k.
            components (dict): block k (int, 1..L) -> (B, T, count, width).
            mask (Tensor): (B, T), 1 at real positions.
            reduce (callable, optional): sums over processes. Default: None
        """
        for k in range(len(self.nets)):
            state = states[f"hidden.{k}"]
            mean = masked_mean(state, mask, reduce)
            spread = (masked_mean(state.float().pow(2), mask, reduce) - mean.pow(2)).clamp(min=0.0).sqrt()
            getattr(self, f"feature_mean_{k}").copy_(mean)
            # a feature (nearly) constant over the first batch must not be blown up by
            # its own tiny spread: on other inputs it would saturate the tanh, whose
            # gradient then vanishes and leaves those inputs' gates where they are
            floor = max(1e-4, 0.1 * float(spread.mean()))
            getattr(self, f"feature_std_{k}").copy_(spread.clamp(min=floor))
            self.baselines[k].copy_(masked_mean(components[k + 1], mask, reduce))

    def forward(self, state: Tensor, mask: Tensor, layer: int) -> Tensor:
        r"""
        The gate logits of block ``layer``'s components.

        Args:

            state (Tensor): (B, T, H) the block's input, ``hidden.{layer-1}``.
            mask (Tensor): (B, T), 1 at real positions.
            layer (int): the block, 1..L.

        Returns:
            *Tensor* (B, count) of gate logits.
        """
        k = layer - 1
        net = self.nets[k]
        if self.per_task:
            return net.bias.expand(state.shape[0], -1)
        standard = (state.float() - getattr(self, f"feature_mean_{k}")) / getattr(self, f"feature_std_{k}")
        weights = mask.to(standard.dtype).unsqueeze(-1)
        pooled = (standard * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.max_activation * torch.tanh(net.last(torch.tanh(net.first(pooled)))) + net.bias
