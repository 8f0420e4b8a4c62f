"""Scoring attributions: divergence to a ground truth, agreement with exact
erasure, faithfulness (comprehensiveness, sufficiency, AOPC, infidelity,
sensitivity) and plausibility, stability across seeds, paired bootstrap
intervals, and the toy task whose answer is known."""

from typing import Any

from captum_diffmask.evaluation.bootstrap import paired_bootstrap
from captum_diffmask.evaluation.faithfulness import (
    eraser_scores, plausibility, token_infidelity, token_sensitivity, TokenEraser,
)
from captum_diffmask.evaluation.perturbations import token_removal, token_substitution
from captum_diffmask.evaluation.stability import fit_stability, seed_std, swap_test

__all__ = [
    "fit_stability", "seed_std", "swap_test", "eraser_scores", "plausibility", "token_infidelity", "token_sensitivity",
    "TokenEraser", "paired_bootstrap", "token_removal", "token_substitution",
]


def __getattr__(name: str) -> Any:
    # compare, Comparison and the method registry left this package (old paths, one release)
    from captum_diffmask.old_paths import moved_name

    return moved_name(__name__, name)
