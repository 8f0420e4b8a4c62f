"""The methods DiffMask is compared with, as Captum attributions of one shape:
``attribute(inputs, target=None, additional_forward_args=None, layer=k)`` returns
(B, T) scores for the input tokens (``layer=0``) or the states of ``hidden.k``,
higher = more important, 0 at padding. :class:`AttributionPatching` scores model
components instead: (B, count) per block, the gradient baseline of DiffMask's
``heads`` and ``units`` modes."""

from ..attribution import site_for_layer, SiteAttribution
from .optimization import optimize
from .attribution_patching import AttributionPatching
from .bottleneck import PerSampleBottleneck
from .erasure import ErasureResult, ExactErasure
from .gradients import IntegratedGradients, Occlusion
from .guan import Guan
from .per_example import MaskResult, PerExampleDiffMask, REINFORCE
from .random import RandomAttribution
from .readout_bottleneck import ReadoutBottleneck

__all__ = [
    "SiteAttribution",
    "optimize",
    "site_for_layer",
    "IntegratedGradients",
    "Occlusion",
    "PerSampleBottleneck",
    "ReadoutBottleneck",
    "Guan",
    "ExactErasure",
    "ErasureResult",
    "PerExampleDiffMask",
    "REINFORCE",
    "MaskResult",
    "RandomAttribution",
    "AttributionPatching",
]
