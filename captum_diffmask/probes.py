"""The gate networks of DiffMask and the learned baselines they mix in.

A probe for layer k reads hidden states and outputs, per token, the logit of a Hard
Concrete gate. Input mode: vote networks 0..k each read ``[input; hidden.j]`` and
the token is kept only if every vote is non-zero (the product of the votes).
Hidden mode: one network reads ``hidden.k`` and gates ``hidden.k`` itself.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn, Tensor
from torch.nn.utils.parametrizations import weight_norm


class GateMLP(nn.Module):
    r"""
    One gate network: ``xi * tanh(NN(x)) + b`` with ``NN = [hidden, tanh, 1]``.

    The paper's parameterisation (its appendix on the probe): weight-normalised
    linear layers, the output bounded to ``(-xi, xi)`` for stability, and a
    learnable bias started at 5 so that gates start open (``P(z != 0) ~ 0.995``):
    a probe that starts by masking destroys the signal it must learn from.

    Args:

        in_features (int): size of the features read per token.
        hidden_features (int): size of the hidden layer.
        max_activation (float, optional): xi. Default: 10.0
        init_bias (float, optional): initial b. Default: 5.0
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        max_activation: float = 10.0,
        init_bias: float = 5.0,
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            weight_norm(nn.Linear(in_features, hidden_features)),
            nn.Tanh(),
            weight_norm(nn.Linear(hidden_features, 1)),
        )
        # Start every gate at exactly the bias (NN output ~ 0, tanh in its linear
        # range): a random start puts some gates at the saturated ends of the
        # tanh, where they receive no gradient for many steps.
        last = self.net[2]
        with torch.no_grad():
            last.parametrizations.weight.original0.fill_(1e-3)
            last.bias.zero_()
        self.max_activation = float(max_activation)
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))
        # Feature standardisation, set from data by `standardize`: hidden states
        # of trained models have large, shifted activations that saturate the tanh.
        self.register_buffer("feature_mean", torch.zeros(in_features))
        self.register_buffer("feature_std", torch.ones(in_features))

    @torch.no_grad()
    def standardize(self, features: Tensor, mask: Tensor) -> None:
        r"""Sets the feature mean and std from (B, T, in_features) over real tokens."""
        real = features.float()[mask.bool()]
        self.feature_mean.copy_(real.mean(0))
        self.feature_std.copy_(real.std(0, unbiased=False).clamp(min=1e-4) if len(real) > 1 else torch.ones_like(self.feature_std))

    def forward(self, features: Tensor) -> Tensor:
        r"""
        Args:

            features (Tensor): (..., in_features).

        Returns:
            *Tensor* (...) of gate logits in ``(b - xi, b + xi)``.
        """
        out = self.net((features.float() - self.feature_mean) / self.feature_std).squeeze(-1)
        return self.max_activation * torch.tanh(out) + self.bias


def _mean_state(state: Tensor, mask: Tensor) -> Tensor:
    weights = mask.float().unsqueeze(-1)
    return (state.float() * weights).sum((0, 1)) / weights.sum().clamp(min=1.0)


class InputGateProbe(nn.Module):
    r"""
    Votes on the input tokens from ``hidden.0 .. hidden.k``, and the input baseline.

    Args:

        input_size (int): H of the ``input`` site.
        hidden_sizes (sequence of int): H of ``hidden.0 .. hidden.L``.
        hidden_features (int): hidden layer size of each vote network.
        read_input (bool, optional): vote j reads ``[input; hidden.j]`` (the paper)
                    when True, ``hidden.j`` alone when False. The input makes it
                    easy for a vote to key on token identity, which can trap it in
                    masking the same tokens whatever the context (seen on the toy
                    task, where the input is 64-d and the state 2-d). Default: True
    """

    def __init__(
        self,
        input_size: int,
        hidden_sizes: Sequence[int],
        hidden_features: int,
        read_input: bool = True,
    ) -> None:
        super().__init__()
        self.read_input = read_input
        extra = input_size if read_input else 0
        self.votes = nn.ModuleList(GateMLP(extra + size, hidden_features) for size in hidden_sizes)
        self.baseline = nn.Parameter(torch.zeros(input_size))

    def _features(self, input_state: Tensor, state: Tensor) -> Tensor:
        if not self.read_input:
            return state.float()
        return torch.cat([input_state.float(), state.float()], dim=-1)

    @torch.no_grad()
    def init_baselines(self, states: dict, mask: Tensor) -> None:
        r"""Starts the baseline at the mean input embedding over real tokens and
        standardises each vote network's features."""
        self.baseline.copy_(_mean_state(states["input"], mask))
        for j, vote in enumerate(self.votes):
            vote.standardize(self._features(states["input"], states[f"hidden.{j}"]), mask)

    def forward(self, input_state: Tensor, hidden_states: Sequence[Tensor]) -> Tensor:
        r"""
        Args:

            input_state (Tensor): (B, T, H_in) the ``input`` site.
            hidden_states (sequence of Tensor): ``hidden.0 .. hidden.k``, each (B, T, H_j).

        Returns:
            *Tensor* (B, T, k + 1) of vote logits, one column per layer read.
        """
        logits: List[Tensor] = [
            vote(self._features(input_state, state)) for vote, state in zip(self.votes, hidden_states)
        ]
        return torch.stack(logits, dim=-1)


class HiddenGateProbe(nn.Module):
    r"""
    Gates on the states of ``hidden.k`` read from ``hidden.k``, and one baseline per layer.

    Args:

        hidden_sizes (sequence of int): H of ``hidden.0 .. hidden.L``.
        hidden_features (int): hidden layer size of each gate network.
    """

    def __init__(self, hidden_sizes: Sequence[int], hidden_features: int) -> None:
        super().__init__()
        self.gates = nn.ModuleList(GateMLP(size, hidden_features) for size in hidden_sizes)
        self.baselines = nn.ParameterList(nn.Parameter(torch.zeros(size)) for size in hidden_sizes)

    @torch.no_grad()
    def init_baselines(self, states: dict, mask: Tensor) -> None:
        r"""Starts each layer's baseline at that layer's mean state over real tokens
        and standardises each gate network's features."""
        for k, baseline in enumerate(self.baselines):
            baseline.copy_(_mean_state(states[f"hidden.{k}"], mask))
            self.gates[k].standardize(states[f"hidden.{k}"], mask)

    def forward(self, state: Tensor, layer: int) -> Tensor:
        r"""
        Args:

            state (Tensor): (B, T, H_k) the ``hidden.k`` site.
            layer (int): k.

        Returns:
            *Tensor* (B, T) of gate logits.
        """
        return self.gates[layer](state)


def mix_baseline(state: Tensor, gate: Tensor, baseline: Tensor) -> Tensor:
    r"""
    ``z * h + (1 - z) * b``: the masked state.

    Args:

        state (Tensor): (B, T, H) the original activation.
        gate (Tensor): (B, T) gate values in ``[0, 1]``.
        baseline (Tensor): (H,) the replacement vector.

    Returns:
        *Tensor* (B, T, H) in the dtype of ``state``.
    """
    z = gate.unsqueeze(-1)
    return (z * state + (1.0 - z) * baseline).to(state.dtype)
