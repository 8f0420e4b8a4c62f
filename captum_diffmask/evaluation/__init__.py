"""Evaluating attributions: divergence to a ground truth, agreement with exact
erasure, faithfulness (comprehensiveness, sufficiency, AOPC, infidelity,
sensitivity) and plausibility, stability across seeds, paired bootstrap intervals,
and side-by-side comparisons of methods."""

from .bootstrap import paired_bootstrap
from .compare import compare, LIBRARY_METHODS, METHODS, prepare_method, PreparedMethod, route_options
from .comparison import Comparison, MethodResult
from .faithfulness import eraser_scores, plausibility, token_infidelity, token_sensitivity, TokenEraser
from .stability import fit_stability, seed_std

__all__ = [
    "compare", "Comparison", "LIBRARY_METHODS", "MethodResult", "METHODS", "prepare_method", "PreparedMethod", "route_options",
    "fit_stability", "seed_std", "eraser_scores", "plausibility", "token_infidelity", "token_sensitivity",
    "TokenEraser", "paired_bootstrap",
]
