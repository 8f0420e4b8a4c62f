"""What the fit needs of the explainer it trains: the :class:`Fittable` interface
(:class:`~captum_diffmask.diffmask.gated_model.GatedModel` offers it), so that the
fit never imports the explainer."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

import torch
from torch import Tensor

from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers
from captum_diffmask.diffmask.gates import Gates
from captum_diffmask.model.arguments import PreparedCall
from captum_diffmask.model.forward import Batch


class Fittable(Protocol):
    r"""
    What the fit needs of the explainer it trains (:class:`~captum_diffmask.DiffMask`
    offers it): the model and its sites, the probe and multipliers with their
    gates, and the passes that read and replace sites.
    """

    model: torch.nn.Module
    mode: str
    l0: str
    probe: Optional[torch.nn.Module]
    lambdas: Optional[LagrangeMultipliers]
    site_sizes: Dict[str, int]
    fitted_layers: List[int]
    convergence: Dict[int, Any]
    fit_record: Dict[str, Any]

    @property
    def num_layers(self) -> int: ...  # noqa: E704 - a protocol's signature

    @property
    def gated_layers(self) -> List[int]: ...  # noqa: E704 - the layers a fit trains by default

    @property
    def independent_layers(self) -> bool: ...  # noqa: E704

    @property
    def gates(self) -> Gates: ...  # noqa: E704

    @property
    def site_names(self) -> List[str]: ...  # noqa: E704

    def follow_model(self) -> None: ...  # noqa: E704

    def config(self) -> Dict[str, Any]: ...  # noqa: E704

    def prepare_batch(self, batch: Any, layer: Any, argument: str) -> PreparedCall: ...  # noqa: E704

    def capture(self, call: PreparedCall, names: Optional[Iterable[str]] = None,
                stop_early: bool = False) -> Tuple[Dict[str, Tensor], Optional[Tensor]]: ...  # noqa: E704

    def replaced_logits(self, call: PreparedCall, replacements: Mapping[str, Any]) -> Tensor: ...  # noqa: E704

    def build_probe(self, states: Dict[str, Tensor], mask: Tensor, reduce: Any = None,
                    call: Optional[PreparedCall] = None) -> None: ...  # noqa: E704

    def restore_probe(self, site_sizes: Mapping[str, int], probe: Mapping[str, Any],
                      lambdas: Mapping[str, Any]) -> None: ...  # noqa: E704

    def evaluate(self, dataloader: Iterable[Batch], layers: Optional[Sequence[int]] = None,
                 rule: str = "threshold") -> Dict[int, Dict[str, float]]: ...  # noqa: E704


