"""What a view says of each layer's probe: the convergence status its fit ended
with (:attr:`DiffMask.convergence`), and what each status means for a reader.
A method without a fit of its own (gradients, occlusion, the per-example masks)
has none; Integrated Gradients gives its own verdict on its last call's numbers
(its completeness gap: :func:`~captum_diffmask.model.attribution.check_verdict`)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

from captum_diffmask.diffmask.constrained.convergence import SETTLED
from captum_diffmask.model.attribution import CHECKED, FAILED_CHECK

#: What each status a reader may read as a result (:data:`SETTLED`) means.
SETTLED_MEANINGS: Dict[str, str] = {
    "converged": "the probe settled with the masked output within the KL margin",
    "needed": "every gate open because the output needs every position",
}
#: What the other statuses share: the fit ended before the probe settled.
UNSETTLED_MEANING = ("any other status (unsettled, violated, open, closed, collapsed) ends a fit that stopped "
                     "before the probe settled: not a result to read (DiffMask.convergence says why, per layer)")
#: A probe saved before checkpoints held the verdicts, or a layer no record names.
NOT_RECORDED = "not recorded"


def layer_verdict(method: Any, layer: Optional[int]) -> str:
    r"""
    The convergence status of ``method``'s probe at ``layer``.

    Args:

        method: any method; a fitted :class:`~captum_diffmask.DiffMask` has one
                    per layer in its ``convergence``.
        layer (int, optional): the layer (None: the mean over every layer, which
                    has no single verdict).

    Returns:
        *str*: the status (``"converged"``, ``"needed"``, ``"unsettled"``, ...),
        :data:`NOT_RECORDED` for a fitted probe without one, a method's check of
        its last call at ``layer`` (:func:`~captum_diffmask.model.attribution.check_verdict`), or ``""`` for a
        method with neither, or ``layer=None``.
    """
    convergence = getattr(method, "convergence", None)
    checks = getattr(method, "last_check", None)
    if layer is not None and not isinstance(convergence, Mapping) and isinstance(checks, Mapping):
        return str(checks.get(layer, ""))  # a method's check of its last call's numbers
    if not isinstance(convergence, Mapping) or layer is None:
        return ""
    report = convergence.get(layer)
    return str(report["status"]) if isinstance(report, Mapping) and "status" in report else NOT_RECORDED


def layer_verdicts(method: Any, layers: Sequence[Optional[int]]) -> Dict[int, str]:
    r"""``{layer: layer_verdict(method, layer)}`` for each of ``layers`` that has
    a verdict (empty for a method without a fit of its own)."""
    verdicts = {layer: layer_verdict(method, layer) for layer in layers if layer is not None}
    return {layer: verdict for layer, verdict in verdicts.items() if verdict}


def is_settled(verdict: str) -> bool:
    r"""Whether a verdict is one a reader may read as a result: a settled
    probe, or a method's own check passed (:func:`~captum_diffmask.model.attribution.check_verdict`)."""
    return verdict in SETTLED or verdict.startswith(f"{CHECKED}:")


def is_check(verdict: str) -> bool:
    r"""Whether a verdict is a method's check of its own numbers, not a fit's status."""
    return verdict.startswith((f"{CHECKED}:", f"{FAILED_CHECK}:"))
