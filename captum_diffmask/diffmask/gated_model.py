"""The analysed model as DiffMask gates it: the mode (input tokens, hidden
states, attention heads or MLP units), the layers that have gates, the probe and
multipliers (built on a fit's first batch, or restored from a saved state), and
the probe's :class:`~captum_diffmask.diffmask.gates.Gates`.

:class:`GatedModel` is what a fit trains (it offers the fit's
:class:`~captum_diffmask.diffmask.fit.fittable.Fittable` interface);
:class:`~captum_diffmask.diffmask.explainer.DiffMask` adds the fit itself,
``attribute``, the noise-free read-out and saving.
"""


from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.component_probe import ComponentGateProbe
from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers
from captum_diffmask.diffmask.gates import COMPONENT_MODES, Gates
from captum_diffmask.diffmask.hard_concrete import DIFFMASK_DEFAULTS, HardConcrete
from captum_diffmask.diffmask.probes import HiddenGateProbe, InputGateProbe, Reduce, VOTES
from captum_diffmask.diffmask.sparsity import L0_KINDS
from captum_diffmask.model.arguments import check_layer, ForwardFunc, PaddingMaskArg, PreparedCall
from captum_diffmask.model.attribution import SiteAttribution, SitesType
from captum_diffmask.model.components import (
    ComponentSite, ComponentSpec, locate_components, named_components, read_components,
)
from captum_diffmask.model.forward import model_device
from captum_diffmask.model.site_finding import HOW_TO_PASS_SITES

_MODES = ("input", "hidden", *COMPONENT_MODES)



class GatedModel(SiteAttribution):
    r"""
    A model with DiffMask's gates on its sites: the base of
    :class:`~captum_diffmask.diffmask.explainer.DiffMask`, whose docstring
    documents the constructor's arguments.
    """

    def __init__(
        self,
        model: nn.Module,
        mode: str = "input",
        sites: SitesType = None,
        forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
        temperature: float = DIFFMASK_DEFAULTS[0],
        stretch: Tuple[float, float] = DIFFMASK_DEFAULTS[1:],
        probe_hidden_size: Optional[int] = None,
        l0: str = "mean",
        probe_reads_input: bool = True,
        rerun: str = "partial",
        init_bias: float = 5.0,
        votes: str = "per_depth",
        per_task: bool = False,
        components: Optional[Mapping[int, ComponentSpec]] = None,
        joint: bool = False,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if rerun not in ("partial", "full"):
            raise ValueError(f"rerun must be 'partial' or 'full', got {rerun!r}")
        if l0 not in L0_KINDS:
            raise ValueError(f"l0 must be one of {L0_KINDS}, got {l0!r}")
        if votes not in VOTES:
            raise ValueError(f"votes must be one of {VOTES}, got {votes!r}")
        HardConcrete(torch.zeros(1), temperature, stretch)  # validates both
        SiteAttribution.__init__(self, model, sites, forward_func, padding_mask_arg, output)
        self.declared_output = output
        self.mode = mode
        #: the gated components of blocks 1..L (``heads``/``units`` modes; empty otherwise)
        self.components = self._component_sites(components)
        self.temperature = float(temperature)
        self.stretch = (float(stretch[0]), float(stretch[1]))
        self.probe_hidden_size = probe_hidden_size
        self.l0 = l0
        self.probe_reads_input = bool(probe_reads_input)
        self.rerun = rerun
        self.init_bias = float(init_bias)
        self.votes = votes
        if per_task and mode not in COMPONENT_MODES:
            raise ValueError(f"per_task: a mask shared by every input needs mode 'heads' or 'units', got mode {mode!r}")
        self.per_task = bool(per_task)
        if joint and mode not in COMPONENT_MODES:
            raise ValueError(f"joint: one mask over every block needs mode 'heads' or 'units', got mode {mode!r}")
        self.joint = bool(joint)
        self.probe: Optional[nn.Module] = None
        self.lambdas: Optional[LagrangeMultipliers] = None
        self.site_sizes: Dict[str, int] = {}
        #: after :meth:`fit`: layer -> its convergence report (see
        #: :meth:`LayerMonitor.report`); empty before
        self.convergence: Dict[int, Dict[str, Any]] = {}
        #: after :meth:`fit`: its options, steps and data size
        #: (:func:`~captum_diffmask.diffmask.fit.record.fit_record`); empty before
        self.fit_record: Dict[str, Any] = {}
        #: the layers a fit has trained (over every call of :meth:`fit`); the
        #: probe of any other layer is its untrained start, which
        #: :meth:`attribute` refuses
        self.fitted_layers: List[int] = []

    def _component_sites(self, components: Optional[Mapping[int, ComponentSpec]]) -> List[ComponentSite]:
        if self.mode not in COMPONENT_MODES:
            if components is not None:
                raise ValueError(f"components: only the modes 'heads' and 'units' gate components, got mode {self.mode!r}")
            return []
        if components is None:
            return locate_components(self.model, self.mode, self.locator)
        return named_components(self.mode, components, self.num_layers)

    @property
    def is_fitted(self) -> bool:
        return self.probe is not None

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ValueError("DiffMask is not fitted: call fit(...) or DiffMask.load(...) first")
        self.follow_model()

    def _check_layers_fitted(self, layers: Sequence[int]) -> None:
        missing = [k for k in layers if k not in self.fitted_layers]
        if missing:
            raise ValueError(
                f"layer: DiffMask was fitted at layers {self.fitted_layers}, not at {missing}; its probe there "
                f"is untrained: pass one of the fitted layers, or fit(..., layers={sorted(set(self.fitted_layers) | set(missing))})"
            )

    def follow_model(self) -> None:
        r"""The probe, baselines and multipliers on the model's device (a model moved
        after the fit takes them along)."""
        device = model_device(self.model)
        if self.probe is not None and self.lambdas is not None and self.lambdas.values.device != device:
            self.probe.to(device)
            self.lambdas.to(device)

    def to(self, device: Union[str, torch.device]) -> "GatedModel":
        r"""
        Moves the analysed model and the fitted probe, baselines and multipliers
        to ``device``; batches follow the model's device in every call.

        Args:

            device (str or torch.device): e.g. ``"cuda"``.

        Returns:
            itself.
        """
        self.model.to(device)
        self.follow_model()
        return self

    # -------------------------------------------------- what the fit uses
    def build_probe(self, states: Dict[str, Tensor], mask: Tensor, reduce: Optional[Reduce] = None,
                    call: Optional[PreparedCall] = None) -> None:
        r"""
        Creates the probe and multipliers from the site sizes of a fit's first
        batch, and starts the baselines at the batch's mean states.

        Args:

            states (dict): site name -> (B, T, H) activations of every site.
            mask (Tensor): (B, T) padding mask (1 = real token).
            reduce (callable, optional): sums the statistics over every process's
                        batch (a distributed fit). Default: None
            call (PreparedCall, optional): the batch itself; the component modes
                        read its components (their baselines start at the mean).
                        Default: None

        Raises:
            ValueError naming ``sites`` when a site does not hold (B, T, H) states.
        """
        paths = {name: path for name, path, _ in self.locator.describe()}
        for name, state in states.items():
            if state.dim() != 3 or state.shape[:2] != mask.shape:
                raise ValueError(
                    f"sites: {name} (read at {paths[name]}) holds activations of shape {tuple(state.shape)} in "
                    f"{type(self.model).__name__}; "
                    f"DiffMask gates (batch, tokens, features) states, {tuple(mask.shape)} + (H,) here (a model "
                    f"whose blocks pool the tokens, as Funnel's, needs other sites). " + HOW_TO_PASS_SITES)
        self.site_sizes = {name: int(state.shape[-1]) for name, state in states.items()}
        self._make_modules()
        assert self.probe is not None
        if not self.components:
            self.probe.init_baselines(states, mask, reduce)
            return
        if call is None:
            raise ValueError("call: the component modes read the batch's components to start their baselines")
        with torch.no_grad(), read_components(self.components) as seen:
            self.replaced_logits(call, {"hidden.0": states["hidden.0"]})
        components = {site.layer: seen[site.name] for site in self.components}
        self.probe.init_baselines(states, components, mask, reduce)

    def restore_probe(self, site_sizes: Mapping[str, int], probe: Mapping[str, Any], lambdas: Mapping[str, Any]) -> None:
        r"""
        Rebuilds the probe and multipliers for ``site_sizes`` and loads their
        states (a checkpoint's, or a fit state's).

        Args:

            site_sizes (dict): site name -> H.
            probe (dict): the probe's ``state_dict``.
            lambdas (dict): the multipliers' ``state_dict``.
        """
        self.site_sizes = dict(site_sizes)
        self._make_modules()
        assert self.probe is not None and self.lambdas is not None
        probe_state = dict(probe)
        if "baseline" in probe_state:  # written before input mode had one baseline per depth
            probe_state["baselines.0"] = probe_state.pop("baseline")
        self.probe.load_state_dict(probe_state)
        self.lambdas.load_state_dict(lambdas)

    def _make_modules(self) -> None:
        hidden_sizes = [self.site_sizes[f"hidden.{j}"] for j in range(self.num_layers + 1)]
        width = self.probe_hidden_size or max(max(self.site_sizes.values()) // 4, 32)
        if self.mode == "input":
            self.probe = InputGateProbe(
                self.site_sizes["input"], hidden_sizes, width, read_input=self.probe_reads_input,
                init_bias=self.init_bias, votes=self.votes,
            )
        elif self.components:
            self.probe = ComponentGateProbe(
                hidden_sizes[:-1], [c.count for c in self.components], [c.width for c in self.components], width,
                init_bias=self.init_bias, per_task=self.per_task,
            )
        else:
            self.probe = HiddenGateProbe(hidden_sizes, width, init_bias=self.init_bias)
        self.lambdas = LagrangeMultipliers(self.num_layers + 1)
        device = model_device(self.model)
        self.probe.to(device)
        self.lambdas.to(device)

    @property
    def independent_layers(self) -> bool:
        r"""Whether each layer's probe (gate networks, baseline) is its own, so
        that a fit may train, and freeze, one layer apart from the others:
        hidden and component modes, and input mode with ``votes="per_depth"``."""
        return self.mode != "input" or self.votes == "per_depth"

    @property
    def first_layer(self) -> int:
        r"""The first layer with gates: 1 in the component modes (layer k is
        block k, whose output is ``hidden.k``), else 0; 0 with ``joint``, whose
        one fitted layer 0 gates every block at once."""
        return 1 if self.components and not self.joint else 0

    @property
    def gated_layers(self) -> List[int]:
        r"""The layers with gates of their own, which a fit trains by default:
        0..L, blocks 1..L in the component modes, [0] with ``joint``."""
        return [0] if self.joint else list(range(self.first_layer, self.num_layers + 1))

    def _fitted_as(self, layers: Sequence[int]) -> List[int]:
        r"""The fitted layers that ``layers`` need: with ``joint``, every block is layer 0's."""
        return [0] if self.joint else list(layers)

    def scored(self, layer: Any) -> str:
        r"""What ``attribute(..., layer=layer)`` scores: input mode scores the
        input tokens at every depth (as a probe reading up to depth k judges
        them); hidden mode the states of ``hidden.k``."""
        site = self._site(layer)
        if site is None:
            return "every layer"
        return f"input (probe read to depth {layer})" if self.mode == "input" else site

    def _site(self, layer: Any) -> Optional[str]:
        r"""The site the gates of ``layer`` replace: ``input`` (input mode) or
        ``hidden.k``; None for every layer."""
        if check_layer(layer, self.num_layers, allow_none=True) is None:
            return None
        if layer < self.first_layer:
            raise ValueError(f"layer: mode {self.mode!r} gates blocks 1..{self.num_layers} (layer k: the block whose "
                             f"output is hidden.k), got {layer}")
        if self.components:
            return f"{self.mode}.{layer}" if layer else f"{self.mode}.every"
        return "input" if self.mode == "input" else f"hidden.{layer}"

    @property
    def gates(self) -> Gates:
        r"""The fitted probe's gates (:class:`~captum_diffmask.diffmask.gates.Gates`):
        sampled by the fit, in closed form for ``attribute``, noise-free for the
        evaluation."""
        if self.probe is None:
            raise ValueError("DiffMask is not fitted: call fit(...) or DiffMask.load(...) first")
        return Gates(self.probe, self.mode, self.temperature, self.stretch, self.components)

    def learned_baseline(self, layer: int) -> Tensor:
        r"""
        The fitted replacement of the states gated off at ``layer``.

        Args:

            layer (int): 0..L; input mode: the depth (one baseline for every
                        depth with ``votes="tied"``), hidden mode: ``hidden.k``.

        Returns:
            *Tensor* (H,) of the replaced site, detached.
        """
        self._check_fitted()
        self._site(check_layer(layer, self.num_layers))
        return self.gates.masked_site(layer)[1].detach()

    def config(self) -> Dict[str, Any]:
        r"""The constructor's options that shape the probe (JSON-ready): what a
        checkpoint and a fit state are written with, and a loaded one is built
        from."""
        return {
            "mode": self.mode,
            "temperature": self.temperature,
            "stretch": list(self.stretch),
            "probe_hidden_size": self.probe_hidden_size,
            "l0": self.l0,
            "probe_reads_input": self.probe_reads_input,
            "rerun": self.rerun,
            "init_bias": self.init_bias,
            "votes": self.votes,
            "per_task": self.per_task,
            "joint": self.joint,
            "output": self.declared_output,
        }

