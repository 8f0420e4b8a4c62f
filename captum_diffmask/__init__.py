"""captum_diffmask: Differentiable Masking (DiffMask) and the methods it is compared
with, as Captum attributions."""

from .convergence import Convergence, DiffMaskConvergenceWarning
from .diffmask import DiffMask
from .forward import ModelForward
from .generation import attribute_generation, GenerationAttribution, prefix_batches
from .hard_concrete import HardConcrete
from .methods import (
    AttributionPatching, ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, PerSampleBottleneck, RandomAttribution,
    ReadoutBottleneck, REINFORCE,
)
from .objective import js_divergence, kl_divergence, LagrangeMultipliers
from .sites import Site, SiteLocator
from .evaluation import compare, Comparison, fit_stability, seed_std
from .text import explain, Explanation, merge_into_words

__version__ = "0.1.0"

__all__ = [
    "AttributionPatching",
    "Comparison",
    "Convergence",
    "DiffMask",
    "DiffMaskConvergenceWarning",
    "ExactErasure",
    "Explanation",
    "GenerationAttribution",
    "Guan",
    "IntegratedGradients",
    "HardConcrete",
    "LagrangeMultipliers",
    "ModelForward",
    "Occlusion",
    "PerExampleDiffMask",
    "PerSampleBottleneck",
    "RandomAttribution",
    "ReadoutBottleneck",
    "REINFORCE",
    "Site",
    "SiteLocator",
    "attribute_generation",
    "compare",
    "explain",
    "merge_into_words",
    "fit_stability",
    "seed_std",
    "js_divergence",
    "kl_divergence",
    "prefix_batches",
    "__version__",
]
