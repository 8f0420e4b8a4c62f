"""DiffMask's gates in one place: from a probe's logits to Hard Concrete gates,
for either mode.

- **hidden mode**: the gates of ``hidden.k`` come from one gate network reading
  ``hidden.k``; a position is kept with ``P(z != 0)`` of its Hard Concrete.
- **input mode**: the gates of the input tokens at depth k are the product of
  k + 1 votes, one from each of ``hidden.0 .. hidden.k``; a token is kept only
  if every vote is non-zero, so its ``log P(z != 0)`` is the sum of the votes'.
- **component modes** (``"heads"``, ``"units"``): the gates of block k's heads or
  MLP units, one per component and input, read from the block's input
  ``hidden.{k-1}`` pooled over the input's real positions
  (:class:`~captum_diffmask.diffmask.component_probe.ComponentGateProbe`); a closed
  component is replaced inside the block (:func:`~captum_diffmask.model.components.gate_components`).
  Layer 0, which has no components of its own, is the **joint mask**: every
  block's gates at once, concatenated (B, sum of counts), fitted against one
  constraint on the model with all of them applied (``DiffMask(joint=True)``).

The fit samples them (:meth:`Gates.sample`), ``attribute`` returns the keep
probabilities (:meth:`Gates.keep_probabilities`) and the evaluation applies the
noise-free read-out (:meth:`Gates.deterministic`): all three take the votes'
product here, so the trained and the deployed gates cannot drift apart.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.hard_concrete import HardConcrete
from captum_diffmask.diffmask.probes import mix_baseline
from captum_diffmask.model.checks import check_choice
from captum_diffmask.model.components import ComponentSite, gate_components

#: How the fit samples input mode's gate from its votes: ``"joint"``, one Hard
#: Concrete with the votes' product as its ``P(z != 0)``; ``"product"``, the
#: product of one relaxed sample per vote (the authors' code).
VOTE_SAMPLING = ("product", "joint")

#: Draws the fit's uniform noise of a given shape (a distributed fit shares it).
Noise = Callable[[torch.Size], Tensor]

#: The modes whose gates are on model components (per input), not on positions.
COMPONENT_MODES = ("heads", "units")


class Gates:
    r"""
    The gates a fitted (or fitting) probe predicts, mode-aware.

    Args:

        probe (nn.Module): an :class:`~captum_diffmask.diffmask.probes.InputGateProbe`
                    (input mode), a :class:`~captum_diffmask.diffmask.probes.HiddenGateProbe`
                    or a :class:`~captum_diffmask.diffmask.component_probe.ComponentGateProbe`.
        mode (str): ``"input"``, ``"hidden"``, ``"heads"`` or ``"units"``.
        temperature (float): the Hard Concrete's temperature.
        stretch (tuple of float): its stretch interval ``(l, r)``.
        components (sequence of ComponentSite, optional): the gated components
                    of blocks 1..L (component modes only). Default: None

    Every ``states`` argument maps site names (``input``, ``hidden.k``) to
    (B, T, H) activations; every ``mask`` is the (B, T) padding mask, which the
    component modes need (their gates pool the real positions) and the others
    ignore. Gates are (B, T) per position, or (B, count) per component.
    """

    def __init__(self, probe: nn.Module, mode: str, temperature: float, stretch: Tuple[float, float],
                 components: Optional[Sequence[ComponentSite]] = None) -> None:
        self.probe, self.mode, self.temperature, self.stretch = probe, mode, temperature, tuple(stretch)
        self.components = {site.layer: site for site in components or []}

    def blocks(self, layer: int) -> List[int]:
        r"""The blocks whose components the gates of ``layer`` are: ``[layer]``,
        or every block for layer 0 (the joint mask) in the component modes."""
        return sorted(self.components) if layer == 0 else [layer]

    @property
    def on_components(self) -> bool:
        r"""Whether the gates are on heads or units rather than on positions."""
        return self.mode in COMPONENT_MODES

    def distribution(self, logits: Tensor) -> HardConcrete:
        r"""The Hard Concrete of ``logits`` (any shape)."""
        return HardConcrete(logits, self.temperature, self.stretch)

    def logits(self, states: Dict[str, Tensor], layer: int, mask: Optional[Tensor] = None) -> Tensor:
        r"""(B, T, layer + 1) vote logits of depth ``layer`` (input mode), (B, T)
        gate logits (hidden mode), (B, count) of block ``layer``'s components;
        the networks a call needs are evaluated together, in one batched call."""
        if self.mode == "input":
            return self.probe(states["input"], [states[f"hidden.{j}"] for j in range(layer + 1)])
        if self.on_components:
            if mask is None:
                raise ValueError("mask: component gates pool the input's real positions; pass the padding mask")
            return torch.cat([self.probe(states[f"hidden.{k - 1}"], mask, k) for k in self.blocks(layer)], -1)
        return self.probe(states[f"hidden.{layer}"], layer)

    def logits_of_layers(self, states: Dict[str, Tensor], layers: Sequence[int],
                         mask: Optional[Tensor] = None) -> Dict[int, Tensor]:
        r"""
        :meth:`logits` of several layers, the probe called once where it can
        evaluate them together (input and hidden mode; input mode's votes that
        read the same ``hidden.j`` on one copy of its features).

        Returns:
            *dict* layer -> that layer's :meth:`logits`.
        """
        layers = [int(k) for k in layers]
        if self.mode == "input" and len(layers) > 1:
            hidden = [states[f"hidden.{j}"] for j in range(max(layers) + 1)]
            return dict(zip(layers, self.probe.depths(states["input"], hidden, layers)))
        if self.mode == "hidden" and len(layers) > 1:
            logits = self.probe.layers([states[f"hidden.{k}"] for k in layers], layers)
            return {k: logits[..., i] for i, k in enumerate(layers)}
        return {k: self.logits(states, k, mask) for k in layers}

    def log_keep(self, distribution: HardConcrete, l0_floor: float = 0.0) -> Tensor:
        r"""(B, T) ``log P(z != 0)`` of a position under ``distribution`` (of
        :meth:`logits`): input mode's votes summed (kept only if every vote is);
        ``l0_floor``: see :meth:`HardConcrete.log_prob_nonzero_floored`."""
        log_keep = distribution.log_prob_nonzero_floored(l0_floor)
        return log_keep.sum(-1) if self.mode == "input" else log_keep

    def sample(
        self, states: Dict[str, Tensor], layer: int, vote_sampling: str = "joint", noise: Optional[Noise] = None,
        mask: Optional[Tensor] = None, l0_floor: float = 0.0,
    ) -> Tuple[Tensor, Tensor]:
        r"""
        The fit's relaxed gates of ``layer``, differentiable in the probe.

        Args:

            states (dict): the activations.
            layer (int): 0..L.
            vote_sampling (str, optional): see :data:`VOTE_SAMPLING` (input
                        mode only). Default: ``"joint"``
            noise (callable, optional): the uniform noise for a shape; None
                        draws it from torch's RNG. Default: None
            mask (Tensor, optional): (B, T) padding mask. Default: None
            l0_floor (float, optional): the least L0 gradient of an open gate in
                        the returned ``log_keep``
                        (:meth:`HardConcrete.log_prob_nonzero_floored`); the
                        sampled gates do not depend on it. Default: 0.0

        Returns:
            *tuple* ``(gates, log_keep)``, both (B, T) (component modes:
            (B, count)): the sampled gates in [0, 1] and ``log P(z != 0)``.
        """
        gates, log_keep, _ = self.sample_with_plain(states, layer, vote_sampling, noise, mask, l0_floor)
        return gates, log_keep

    def sample_with_plain(
        self, states: Dict[str, Tensor], layer: int, vote_sampling: str = "joint", noise: Optional[Noise] = None,
        mask: Optional[Tensor] = None, l0_floor: float = 0.0, logits: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor, Tensor]:
        r"""
        :meth:`sample`, and the plain ``log P(z != 0)`` beside the floored one
        (the same tensor when ``l0_floor`` is 0): the L0 takes the floored one,
        an estimate of the KL's gradient through the gates' events the plain one.
        ``logits``: the layer's :meth:`logits` when the caller has them
        (:meth:`logits_of_layers`); None computes them.

        Returns:
            *tuple* ``(gates, log_keep, plain_log_keep)``, each (B, T)
            (component modes: (B, count)).
        """
        check_choice(vote_sampling, VOTE_SAMPLING, "vote_sampling")
        distribution = self.distribution(self.logits(states, layer, mask) if logits is None else logits)
        sampled, log_keep = distribution, self.log_keep(distribution)
        if self.mode == "input" and vote_sampling == "joint":
            # one gate with that probability: no product of k + 1 relaxed samples,
            # each a little below 1, shrinking the kept tokens at depth
            sampled = HardConcrete.with_prob_nonzero(log_keep, self.temperature, self.stretch)
        gates = sampled.rsample(uniform=None if noise is None else noise(sampled.logits.shape))
        if self.mode == "input" and vote_sampling == "product":
            gates = gates.prod(-1)
        return gates, (self.log_keep(distribution, l0_floor) if l0_floor > 0.0 else log_keep), log_keep

    def keep_probabilities(self, states: Dict[str, Tensor], layer: int, mask: Optional[Tensor] = None) -> Tensor:
        r"""(B, T) ``P(z != 0)`` of ``layer`` (0..L), in closed form (no sampling);
        component modes: (B, count) of block ``layer`` (1..L)."""
        return self.log_keep(self.distribution(self.logits(states, layer, mask))).exp()

    def keep_probabilities_every_layer(self, states: Dict[str, Tensor], num_layers: int,
                                       mask: Optional[Tensor] = None) -> Tensor:
        r"""(B, T, L + 1) ``P(z != 0)`` of every layer 0..L (``num_layers`` = L),
        each network evaluated once; component modes: (B, L, count) of blocks
        1..L (the blocks must have as many components each)."""
        if self.on_components:
            every_block = [self.keep_probabilities(states, k, mask) for k in range(1, num_layers + 1)]
            counts = sorted({p.shape[-1] for p in every_block})
            if len(counts) > 1:
                raise ValueError(f"layer: the blocks have {counts} components, which do not stack into one tensor; "
                                 "attribute one layer at a time")
            return torch.stack(every_block, 1)
        every = range(num_layers + 1)
        hidden = [states[f"hidden.{j}"] for j in every]
        if self.mode == "hidden":
            return self.distribution(self.probe.layers(hidden, every)).prob_nonzero()
        votes = self.probe.every_depth(states["input"], hidden)
        return torch.stack([self.log_keep(self.distribution(v)).exp() for v in votes], -1)

    def deterministic(self, states: Dict[str, Tensor], layer: int, rule: str = "threshold",
                      mask: Optional[Tensor] = None) -> Tensor:
        r"""
        (B, T) noise-free gates of ``layer`` ((B, count) in the component modes).

        Args:

            states (dict): the activations.
            layer (int): 0..L.
            rule (str, optional): ``"threshold"`` keeps a position when its
                        ``P(z != 0)`` exceeds 0.5 (the read-out ``attribute``
                        implies); ``"louizos"`` is the clamped test-time gate
                        (input mode: the product of the votes'). Default: ``"threshold"``
            mask (Tensor, optional): (B, T) padding mask. Default: None

        Returns:
            *Tensor* (B, T) in [0, 1].
        """
        if rule == "threshold":
            return (self.keep_probabilities(states, layer, mask) > 0.5).float()
        if rule != "louizos":
            raise ValueError(f"rule must be 'threshold' or 'louizos', got {rule!r}")
        gates = self.distribution(self.logits(states, layer, mask)).deterministic_gate("louizos")
        return gates.prod(-1) if self.mode == "input" else gates

    def masked_site(self, layer: int) -> Tuple[str, Tensor]:
        r"""The site the gates of ``layer`` replace (``input`` or ``hidden.k``)
        and its learned baseline (H,); component modes: ``heads.k`` or
        ``units.k`` and the (count, width) baselines of its components."""
        if self.mode == "input":
            return "input", self.probe.baseline(layer)
        if self.on_components:
            if layer == 0:  # the joint mask: every block's, stacked
                every = [self.probe.baselines[k - 1] for k in self.blocks(0)]
                if len({b.shape[-1] for b in every}) > 1:
                    raise ValueError("joint: the blocks' components differ in width, so one baseline tensor cannot "
                                     "hold them; fit the blocks apart (joint=False)")
                return f"{self.mode}.every", torch.cat(every)
            return f"{self.mode}.{layer}", self.probe.baselines[layer - 1]
        return f"hidden.{layer}", self.probe.baselines[layer]

    def pass_groups(self, layers: Sequence[int], stack: str = "same_site") -> List[List[int]]:
        r"""
        The layers whose masked passes can run as one stacked pass.

        Args:

            layers (sequence of int): the layers of a step or evaluation.
            stack (str, optional): ``"same_site"``: those that replace the same
                        site (input mode's depths); ``"all"``: every layer;
                        ``"none"``: each alone. Component modes gate inside blocks
                        in a context of their own, so each runs alone. Default:
                        ``"same_site"``

        Returns:
            *list* of groups of layers, in the order of ``layers``.
        """
        if stack == "none" or self.on_components:
            return [[k] for k in layers]
        if stack == "all":
            return [list(layers)] if layers else []
        groups: Dict[str, List[int]] = {}
        for k in layers:
            groups.setdefault(self.masked_site(k)[0], []).append(k)
        return list(groups.values())

    def positions(self, mask: Tensor, layer: int) -> Tensor:
        r"""Which gates count (in the L0 and the kept share): (B, T) the real
        positions, or (B, count) every component of block ``layer``."""
        if not self.on_components:
            return mask
        count = sum(self.probe.counts[k - 1] for k in self.blocks(layer))
        return torch.ones(mask.shape[0], count, dtype=mask.dtype, device=mask.device)

    def replacement(
        self, states: Dict[str, Tensor], gates: Tensor, layer: int, baseline: Optional[Tensor] = None,
    ) -> Tuple[Dict[str, Tensor], ContextManager[None]]:
        r"""
        How the gates of ``layer`` change the model: the sites to replace (for
        :meth:`SiteAttribution.replaced_logits`) and the context the pass runs in.

        Position modes replace the gated site by ``z * h + (1 - z) * b`` and need
        no context. Component modes gate the block's components (every block's,
        for layer 0, the joint mask) in a context that hooks them, and put back
        the first gated block's input, so that only the blocks from there on run
        again. ``baseline``: what closed gates mix
        in; None = the learned one (:meth:`masked_site`).

        Returns:
            *tuple* ``(replacements, context)``.
        """
        site, learned = self.masked_site(layer)
        baseline = learned if baseline is None else baseline
        if not self.on_components:
            return {site: mix_baseline(states[site], gates, baseline)}, contextlib.nullcontext()
        blocks = self.blocks(layer)
        sizes = [self.probe.counts[k - 1] for k in blocks]
        names = [self.components[k].name for k in blocks]
        context = gate_components([self.components[k] for k in blocks], dict(zip(names, gates.split(sizes, -1))),
                                  dict(zip(names, baseline.split(sizes, 0))))
        block_input = f"hidden.{blocks[0] - 1}"
        return {block_input: states[block_input]}, context


def layer_sites(mode: str, layer: Optional[int], num_layers: int) -> Sequence[str]:
    r"""The sites the gates of ``layer`` (None: every layer) read: input mode
    the input and ``hidden.0 .. hidden.k``; hidden mode ``hidden.k``; the
    component modes the block's input ``hidden.{k-1}`` (every block's for
    layer 0, the joint mask)."""
    last = num_layers if layer is None else layer
    if mode == "input":
        return ["input"] + [f"hidden.{j}" for j in range(last + 1)]
    if mode in COMPONENT_MODES:  # layer 0: the joint mask, which reads every block's input
        return [f"hidden.{j}" for j in range(num_layers)] if not layer else [f"hidden.{layer - 1}"]
    if layer is None:
        return [f"hidden.{j}" for j in range(num_layers + 1)]
    return [f"hidden.{layer}"]
