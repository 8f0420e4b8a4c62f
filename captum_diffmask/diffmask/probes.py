"""The gate networks of DiffMask and the learned baselines they mix in.

A probe for layer k reads hidden states and outputs, per token, the logit of a Hard
Concrete gate. Input mode: vote networks 0..k each read ``[input; hidden.j]`` and
the token is kept only if every vote is non-zero (the product of the votes); each
depth k has votes of its own (``votes="per_depth"``) or shares them with the other
depths (``"tied"``, the authors').
Hidden mode: one network reads ``hidden.k`` and gates ``hidden.k`` itself.

Both probes keep their networks in one
:class:`~captum_diffmask.diffmask.gate_networks.GateNetworks`, which evaluates
any subset of them in one batched call.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.gate_networks import FeatureParts, GateNetworks, Reduce

#: How input mode's depths get their votes (:class:`InputGateProbe`).
VOTES = ("tied", "per_depth")


def masked_mean(state: Tensor, mask: Tensor, reduce: Optional[Reduce] = None) -> Tensor:
    r"""
    The mean over real positions.

    Args:

        state (Tensor): (B, T, ...) activations.
        mask (Tensor): (B, T), 1 at real positions.
        reduce (callable, optional): sums over processes (a distributed fit).
                    Default: None

    Returns:
        *Tensor* (...) in float32.
    """
    weights = mask.float().reshape(*mask.shape, *([1] * (state.dim() - 2)))
    total, count = (state.float() * weights).sum((0, 1)), weights.sum()
    if reduce is not None:
        total, count = reduce(total), reduce(count)
    return total / count.clamp(min=1.0)


class InputGateProbe(nn.Module):
    r"""
    Votes on the input tokens from ``hidden.0 .. hidden.k``, and the input baseline.

    With ``votes="tied"`` (the authors' code) one vote network, tied across depths, reads each
    ``hidden.j`` and serves every depth k >= j: the gate at depth k is the product
    of votes 0..k, and one baseline replaces the tokens at every depth. Training
    all depths through the same votes couples them: the votes that the shallow
    depths need open stay open at the deep ones too, and every depth ends masking
    about the same tokens. With ``votes="per_depth"`` each depth k has its own
    votes 0..k and its own baseline: k + 1 networks, as if the probe of that
    depth were fitted alone (the sum over depths is (L + 1)(L + 2) / 2 networks).

    Args:

        input_size (int): H of the ``input`` site.
        hidden_sizes (sequence of int): H of ``hidden.0 .. hidden.L``.
        hidden_features (int): hidden layer size of each vote network.
        read_input (bool, optional): vote j reads ``[input; hidden.j]`` (the paper)
                    when True, ``hidden.j`` alone when False. The input makes it
                    easy for a vote to key on token identity, which can trap it in
                    masking the same tokens whatever the context (seen on the toy
                    task, where the input is 64-d and the state 2-d). Default: True
        init_bias (float, optional): the vote networks' initial bias b
                    (:class:`GateNetworks`). Default: 5.0
        votes (str, optional): ``"tied"`` or ``"per_depth"`` (see above).
                    Default: ``"tied"``
    """

    def __init__(
        self,
        input_size: int,
        hidden_sizes: Sequence[int],
        hidden_features: int,
        read_input: bool = True,
        init_bias: float = 5.0,
        votes: str = "tied",
    ) -> None:
        super().__init__()
        if votes not in VOTES:
            raise ValueError(f"votes must be one of {VOTES}, got {votes!r}")
        self.read_input, self.tied = read_input, votes == "tied"
        self.num_depths = len(hidden_sizes)
        extra = input_size if read_input else 0
        depths = [self.num_depths - 1] if self.tied else range(self.num_depths)
        #: the vote networks: tied, vote j reads ``hidden.j``; per depth, the
        #: votes of depth k are networks ``first_vote(k) .. first_vote(k) + k``
        self.votes = GateNetworks(
            [extra + hidden_sizes[j] for k in depths for j in range(k + 1)], hidden_features, init_bias=init_bias
        )
        #: the replacement of gated-off tokens: one (tied) or one per depth
        self.baselines = nn.ParameterList(
            nn.Parameter(torch.zeros(input_size)) for _ in range(1 if self.tied else self.num_depths)
        )

    def first_vote(self, depth: int) -> int:
        r"""The index of vote 0 of ``depth`` among :attr:`votes`."""
        return 0 if self.tied else depth * (depth + 1) // 2

    def baseline(self, depth: int) -> nn.Parameter:
        r"""The (H,) baseline of the tokens gated off at ``depth``."""
        return self.baselines[0 if self.tied else depth]

    def _features(self, input_state: Tensor, state: Tensor) -> FeatureParts:
        return state if not self.read_input else (input_state, state)

    @torch.no_grad()
    def init_baselines(self, states: dict, mask: Tensor, reduce: Optional[Reduce] = None) -> None:
        r"""Starts each baseline at the mean input embedding over real tokens and
        standardises each vote network's features (over every process's batch
        with ``reduce``)."""
        mean = masked_mean(states["input"], mask, reduce)
        for baseline in self.baselines:
            baseline.copy_(mean)
        depths = [self.num_depths - 1] if self.tied else range(self.num_depths)
        for j in range(self.num_depths):  # vote j of every depth reads the same features
            state = states[f"hidden.{j}"]
            features = torch.cat([states["input"].float(), state.float()], -1) if self.read_input else state
            self.votes.standardize([self.first_vote(k) + j for k in depths if k >= j], features, mask, reduce)

    def forward(self, input_state: Tensor, hidden_states: Sequence[Tensor]) -> Tensor:
        r"""
        The votes of depth k = ``len(hidden_states) - 1``.

        Args:

            input_state (Tensor): (B, T, H_in) the ``input`` site.
            hidden_states (sequence of Tensor): ``hidden.0 .. hidden.k``, each (B, T, H_j).

        Returns:
            *Tensor* (B, T, k + 1) of vote logits, one column per layer read; the
            votes are evaluated together.
        """
        first = self.first_vote(len(hidden_states) - 1)
        networks = range(first, first + len(hidden_states))
        return self.votes([self._features(input_state, state) for state in hidden_states], networks)

    def every_depth(self, input_state: Tensor, hidden_states: Sequence[Tensor]) -> List[Tensor]:
        r"""
        The votes of every depth 0..L, evaluated in one call.

        Args:

            input_state (Tensor): (B, T, H_in) the ``input`` site.
            hidden_states (sequence of Tensor): ``hidden.0 .. hidden.L``.

        Returns:
            *list* of L + 1 Tensors: entry k is (B, T, k + 1), the vote logits of depth k.
        """
        return self.depths(input_state, hidden_states, range(len(hidden_states)))

    def depths(self, input_state: Tensor, hidden_states: Sequence[Tensor], depths: Sequence[int]) -> List[Tensor]:
        r"""
        The votes of several depths, evaluated in one call (the votes that read
        the same ``hidden.j`` on one copy of its features).

        Args:

            input_state (Tensor): (B, T, H_in) the ``input`` site.
            hidden_states (sequence of Tensor): ``hidden.0 .. hidden.k``, k the
                        deepest of ``depths`` at least.
            depths (sequence of int): the depths k.

        Returns:
            *list* of Tensors, one per depth in ``depths``' order: (B, T, k + 1),
            the vote logits of depth k.
        """
        depths = [int(k) for k in depths]
        if self.tied:
            votes = self(input_state, hidden_states[: max(depths) + 1])
            return [votes[..., : k + 1] for k in depths]
        pairs = [(k, j) for k in depths for j in range(k + 1)]
        logits = self.votes([self._features(input_state, hidden_states[j]) for _, j in pairs],
                            [self.first_vote(k) + j for k, j in pairs])
        starts = [0]
        for k in depths:
            starts.append(starts[-1] + k + 1)
        return [logits[..., start : start + k + 1] for start, k in zip(starts, depths)]


class HiddenGateProbe(nn.Module):
    r"""
    Gates on the states of ``hidden.k`` read from ``hidden.k``, and one baseline per layer.

    Args:

        hidden_sizes (sequence of int): H of ``hidden.0 .. hidden.L``.
        hidden_features (int): hidden layer size of each gate network.
        init_bias (float, optional): the gate networks' initial bias b
                    (:class:`GateNetworks`). Default: 5.0
    """

    def __init__(self, hidden_sizes: Sequence[int], hidden_features: int, init_bias: float = 5.0) -> None:
        super().__init__()
        #: the gate networks, network k reading and gating ``hidden.k``
        self.gates = GateNetworks(hidden_sizes, hidden_features, init_bias=init_bias)
        self.baselines = nn.ParameterList(nn.Parameter(torch.zeros(size)) for size in hidden_sizes)

    @torch.no_grad()
    def init_baselines(self, states: dict, mask: Tensor, reduce: Optional[Reduce] = None) -> None:
        r"""Starts each layer's baseline at that layer's mean state over real tokens
        and standardises each gate network's features (over every process's batch
        with ``reduce``)."""
        for k, baseline in enumerate(self.baselines):
            baseline.copy_(masked_mean(states[f"hidden.{k}"], mask, reduce))
            self.gates.standardize(k, states[f"hidden.{k}"], mask, reduce)

    def forward(self, state: Tensor, layer: int) -> Tensor:
        r"""
        The gates of one layer (what a training step needs).

        Args:

            state (Tensor): (B, T, H_k) the ``hidden.k`` site.
            layer (int): k.

        Returns:
            *Tensor* (B, T) of gate logits.
        """
        return self.gates([state], [layer])[..., 0]

    def layers(self, states: Sequence[Tensor], layers: Sequence[int]) -> Tensor:
        r"""
        The gates of several layers, evaluated together.

        Args:

            states (sequence of Tensor): the ``hidden.k`` sites, each (B, T, H_k).
            layers (sequence of int): the k of each state.

        Returns:
            *Tensor* (B, T, len(layers)) of gate logits, one column per layer.
        """
        return self.gates(states, layers)


def mix_baseline(state: Tensor, gate: Tensor, baseline: Tensor) -> Tensor:
    r"""
    ``z * h + (1 - z) * b``: the masked state.

    Args:

        state (Tensor): (B, T, H) the original activation.
        gate (Tensor): (B, T) gate values in ``[0, 1]``.
        baseline (Tensor): (H,) the replacement vector, or (B, T, H) one per position.

    Returns:
        *Tensor* (B, T, H) in the dtype of ``state``.
    """
    z = gate.unsqueeze(-1)
    return (z * state + (1.0 - z) * baseline).to(state.dtype)
