"""The methods DiffMask is compared with, as Captum attributions of one shape:
``attribute(inputs, target=None, additional_forward_args=None, layer=k)`` returns
(B, T) scores for the input tokens (``layer=0``) or the states of ``hidden.k``,
higher = more important, 0 at padding. :class:`AttributionPatching` scores model
components instead: (B, count) per block, the gradient baseline of DiffMask's
``heads`` and ``units`` modes."""

from captum_diffmask.model.arguments import site_for_layer
from captum_diffmask.model.attribution import SiteAttribution
from captum_diffmask.methods.optimization import optimize
from captum_diffmask.methods.attribution_patching import AttributionPatching
from captum_diffmask.methods.bottleneck import PerSampleBottleneck
from captum_diffmask.methods.erasure import ErasureResult, ExactErasure
from captum_diffmask.methods.gradients import IntegratedGradients, Occlusion
from captum_diffmask.methods.guan import Guan
from captum_diffmask.methods.per_example import MaskResult, PerExampleDiffMask
from captum_diffmask.methods.reinforce import REINFORCE
from captum_diffmask.methods.random import RandomAttribution
from captum_diffmask.methods.readout_bottleneck import ReadoutBottleneck

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
