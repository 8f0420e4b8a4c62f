"""A fit's history: one row per trained layer and epoch, with the means of its
steps and the layer's convergence status."""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Mapping, Optional

from captum_diffmask.diffmask.constrained.convergence import LayerMonitor, SETTLED
from captum_diffmask.diffmask.fit.fittable import Fittable

LOGGER = logging.getLogger("captum_diffmask")


def last_rows(history: Iterable[Mapping[str, Any]]) -> Dict[int, Mapping[str, Any]]:
    r"""Each layer's last row of a fit's ``history`` (a layer frozen once
    converged has no rows in the epochs after; the last epoch's rows miss it)."""
    return {int(row["layer"]): row for row in history}


def epoch_rows(
    explainer: Fittable, epoch: int, sums: Mapping[int, Mapping[str, float]], seconds: float,
    monitors: Mapping[int, LayerMonitor],
) -> List[Dict[str, Any]]:
    r"""The history rows of one epoch, one per layer trained in it."""
    assert explainer.lambdas is not None
    rows = []
    for k in sorted(sums):
        n = sums[k]["steps"]
        status = monitors[k].status()
        row = {
            "epoch": epoch, "layer": k, "kl": sums[k]["kl"] / n, "l0": sums[k]["l0"] / n,
            "agreement": sums[k]["agreement"] / n, "lambda": float(explainer.lambdas(k).detach()),
            "steps": n, "seconds": seconds, "status": status, "converged": status in SETTLED,
        }
        if "kl_deployed" in sums[k]:
            row["kl_deployed"] = sums[k]["kl_deployed"] / n
        rows.append(row)
    return rows




def log_epoch(epoch: int, epochs: Optional[int], rows: List[Dict[str, Any]]) -> None:
    r"""One INFO line per layer of an epoch's ``rows`` (``verbose``)."""
    for row in rows:
        LOGGER.info(
            "DiffMask fit epoch %d/%s, layer %d: KL %.4g, kept share %.3f, lambda %.3g, agreement %.3f, %d steps, %s",
            epoch, epochs or "-", row["layer"], row["kl"], row["l0"], row["lambda"], row["agreement"], row["steps"],
            row["status"],
        )

