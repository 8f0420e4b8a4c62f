"""A fit's history: one row per trained layer and epoch, with the means of its
steps and the layer's convergence status."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from captum_diffmask.diffmask.constrained.convergence import LayerMonitor, SETTLED
from captum_diffmask.diffmask.fit.fittable import Fittable

LOGGER = logging.getLogger("captum_diffmask")


@contextlib.contextmanager
def log_lines(enabled: bool = True, timestamps: bool = False) -> Iterator[None]:
    r"""
    The library's INFO lines (a fit's line per layer and epoch, its freezes,
    resumptions and cool-down) on stderr while the block runs, so that a long
    fit whose output is a log, not a terminal, shows where it is.

    Args:

        enabled (bool, optional): False: nothing changes. Default: True
        timestamps (bool, optional): each line starts with the time of day.
                    Default: False
    """
    if not enabled:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    if timestamps:
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    level = LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    try:
        yield
    finally:  # the logger as it was found
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)


def last_rows(history: Iterable[Mapping[str, Any]]) -> Dict[int, Mapping[str, Any]]:
    r"""Each layer's last row of a fit's ``history`` (a layer frozen once
    converged has no rows in the epochs after; the last epoch's rows miss it)."""
    return {int(row["layer"]): row for row in history}


def epoch_seconds(history: Iterable[Mapping[str, Any]]) -> Dict[int, float]:
    r"""Each epoch's seconds of training, in the epochs' order, from a fit's
    ``history`` (every row of an epoch carries them; an epoch resumed from a
    fit's state counts the part an earlier invocation ran)."""
    return {int(row["epoch"]): float(row["seconds"]) for row in sorted(history, key=lambda row: row["epoch"])}


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

