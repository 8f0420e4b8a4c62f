"""captum_diffmask: Differentiable Masking (DiffMask) and the methods it is compared
with, as Captum attributions.

The library is in layers, each importing only those below it
(``docs/architecture.md``): :mod:`~captum_diffmask.model` (how any method reaches
into a model), :mod:`~captum_diffmask.diffmask` (the explainer, its probe, fit and
constrained optimisation), :mod:`~captum_diffmask.methods` (the methods it is
compared with, and the registry of every method), :mod:`~captum_diffmask.evaluation`
(scores of attributions) and :mod:`~captum_diffmask.interface` (text, pages,
figures, generation, comparisons, the command line)."""

from captum_diffmask import old_paths
from captum_diffmask.diffmask.constrained.convergence import Convergence, DiffMaskConvergenceWarning
from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers
from captum_diffmask.diffmask.calibration import calibrate_eps, EpsCalibration
from captum_diffmask.diffmask.certificate import Certificate, CertificateTolerances, certify
from captum_diffmask.diffmask.explainer import DiffMask
from captum_diffmask.diffmask.hard_concrete import HardConcrete
from captum_diffmask.evaluation import fit_stability, seed_std, swap_test
from captum_diffmask.interface.comparison import Comparison
from captum_diffmask.interface.depth_view import depth_view
from captum_diffmask.interface.explanation import explain, Explanation
from captum_diffmask.interface.generation import attribute_generation, GenerationAttribution, prefix_batches
from captum_diffmask.interface.side_by_side import compare
from captum_diffmask.methods import (
    AttributionPatching, ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, PerSampleBottleneck,
    RandomAttribution, ReadoutBottleneck, REINFORCE,
)
from captum_diffmask.model.divergences import js_divergence, kl_divergence
from captum_diffmask.model.forward import ModelForward
from captum_diffmask.model.sites import Site, SiteLocator
from captum_diffmask.model.texts import merge_into_words

__version__ = "0.1.0"

old_paths.install()

__all__ = [
    "AttributionPatching",
    "Certificate",
    "CertificateTolerances",
    "Comparison",
    "Convergence",
    "DiffMask",
    "DiffMaskConvergenceWarning",
    "EpsCalibration",
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
    "calibrate_eps",
    "certify",
    "compare",
    "depth_view",
    "explain",
    "merge_into_words",
    "fit_stability",
    "seed_std",
    "swap_test",
    "js_divergence",
    "kl_divergence",
    "prefix_batches",
    "__version__",
]
