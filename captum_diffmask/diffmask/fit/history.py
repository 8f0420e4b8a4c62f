"""A fit's history: one row per trained layer and epoch, with the means of its
steps and the layer's convergence status."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
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




class EpochLog:
    r"""
    A fit's INFO lines (``verbose``): one per layer of an epoch's rows, for an
    epoch that ends :data:`EVERY_SECONDS` or more after the last logged one,
    changes a layer's status, or ends the fit. Epochs of a few steps (a small
    data set) would otherwise log a line per layer and step.
    """

    #: The most seconds between two epochs' lines while nothing changes.
    EVERY_SECONDS = 30.0

    def __init__(self) -> None:
        self.logged_at: Optional[float] = None
        self.statuses: Dict[int, str] = {}

    def epoch(self, epoch: int, epochs: Optional[int], rows: List[Dict[str, Any]], last: bool) -> None:
        r"""Logs ``rows`` (one epoch's, :func:`epoch_rows`) when due; ``last``: the fit ends with it."""
        now = time.perf_counter()
        changed = any(self.statuses.get(int(row["layer"])) != row["status"] for row in rows)
        if last or changed or self.logged_at is None or now - self.logged_at >= self.EVERY_SECONDS:
            log_epoch(epoch, epochs, rows)
            self.logged_at = now
            self.statuses.update({int(row["layer"]): row["status"] for row in rows})


def log_epoch(epoch: int, epochs: Optional[int], rows: List[Dict[str, Any]]) -> None:
    r"""One INFO line per layer of an epoch's ``rows``."""
    for row in rows:
        LOGGER.info(
            "DiffMask fit epoch %d/%s, layer %d: KL %.4g, kept share %.3f, lambda %.3g, agreement %.3f, %d steps, %s",
            epoch, epochs or "-", row["layer"], row["kl"], row["l0"], row["lambda"], row["agreement"], row["steps"],
            row["status"],
        )

