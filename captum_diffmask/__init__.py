"""captum_diffmask: Differentiable Masking (DiffMask) and the methods it is compared
with, as Captum attributions."""

from .diffmask import DiffMask
from .forward import ModelForward
from .hard_concrete import HardConcrete
from .objective import js_divergence, kl_divergence, LagrangeMultipliers
from .sites import Site, SiteLocator

__version__ = "0.1.0"

__all__ = [
    "DiffMask",
    "HardConcrete",
    "LagrangeMultipliers",
    "ModelForward",
    "Site",
    "SiteLocator",
    "js_divergence",
    "kl_divergence",
    "__version__",
]
