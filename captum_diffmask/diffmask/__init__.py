"""DiffMask itself: the explainer (:mod:`~captum_diffmask.diffmask.explainer`),
its Hard Concrete gates and the probe that predicts them, the fit
(:mod:`~captum_diffmask.diffmask.fit`), the constrained optimisation it runs
(:mod:`~captum_diffmask.diffmask.constrained`), and the saved probe
(:mod:`~captum_diffmask.diffmask.saved_probe`). It builds on the model layer
(:mod:`captum_diffmask.model`) and on nothing above it."""

from captum_diffmask.diffmask.constrained.convergence import Convergence, DiffMaskConvergenceWarning
from captum_diffmask.diffmask.explainer import DiffMask
from captum_diffmask.diffmask.fit.option_groups import Compute, Optimization, Validation
from captum_diffmask.diffmask.fit.options import FitOptions, grouped_options

__all__ = ["Compute", "Convergence", "DiffMask", "DiffMaskConvergenceWarning", "FitOptions", "grouped_options",
           "Optimization", "Validation"]
