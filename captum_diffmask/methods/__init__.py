"""The methods DiffMask is compared with, as Captum attributions of one shape:
``attribute(inputs, target=None, additional_forward_args=None, layer=k)`` returns
(B, T) scores for the input tokens (``layer=0``) or the states of ``hidden.k``,
higher = more important, 0 at padding. :class:`AttributionPatching` scores model
components instead: (B, count) per block, the gradient baseline of DiffMask's
``heads`` and ``units`` modes. Each registers itself by name
(:mod:`~captum_diffmask.methods.registry`); :func:`prepare_method` sets one up by
that name (:mod:`~captum_diffmask.methods.preparation`)."""

# the order the methods register in, the order tables list them
from captum_diffmask.methods.gradients import IntegratedGradients, Occlusion  # isort: skip
from captum_diffmask.methods.erasure import ErasureResult, ExactErasure  # isort: skip
from captum_diffmask.methods.bottleneck import PerSampleBottleneck  # isort: skip
from captum_diffmask.methods.readout_bottleneck import ReadoutBottleneck  # isort: skip
from captum_diffmask.methods.guan import Guan  # isort: skip
from captum_diffmask.methods.per_example import MaskResult, PerExampleDiffMask  # isort: skip
from captum_diffmask.methods.reinforce import REINFORCE  # isort: skip
from captum_diffmask.methods.random import RandomAttribution  # isort: skip
from captum_diffmask.methods.attention import AttentionWeights  # isort: skip
from captum_diffmask.methods.attribution_patching import AttributionPatching  # isort: skip
from captum_diffmask.methods.optimization import optimize
from captum_diffmask.methods.preparation import prepare_method, PreparedMethod, route_options
from captum_diffmask.methods.registry import method_class, register_method, registered_methods, unregister_method
from captum_diffmask.model.arguments import site_for_layer
from captum_diffmask.model.attribution import SiteAttribution

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
    "AttentionWeights",
    "register_method",
    "registered_methods",
    "unregister_method",
    "method_class",
    "prepare_method",
    "PreparedMethod",
    "route_options",
]
