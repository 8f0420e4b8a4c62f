"""captum_diffmask: Differentiable Masking (DiffMask) and the methods it is compared
with, as Captum attributions."""

from .convergence import Convergence, DiffMaskConvergenceWarning
from .diffmask import DiffMask
from .forward import ModelForward
from .hard_concrete import HardConcrete
from .objective import js_divergence, kl_divergence, LagrangeMultipliers
from .sites import Site, SiteLocator
from .evaluation import compare, Comparison, fit_stability, seed_std

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "Convergence",
    "DiffMask",
    "DiffMaskConvergenceWarning",
    "HardConcrete",
    "LagrangeMultipliers",
    "ModelForward",
    "Site",
    "SiteLocator",
    "compare",
    "fit_stability",
    "seed_std",
    "js_divergence",
    "kl_divergence",
    "__version__",
]
