"""When a DiffMask fit has converged, and what to say when it has not.

A fit is a game between the gates (closing as many positions as they can) and
one Lagrange multiplier per layer (holding the KL within eps). It has converged
at a layer when both have stopped moving and the constraint holds. The steps
trained at a layer are grouped in windows of ``window`` steps; the window means
of the kept share, the multiplier and the KL are compared window to window.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

#: A layer's states at the end of a fit; only ``"converged"`` needs no warning.
STATUSES = ("converged", "unsettled", "violated", "open", "closed")


class DiffMaskConvergenceWarning(UserWarning):
    r"""DiffMask.fit stopped with a layer that has not converged."""


@dataclass(frozen=True)
class Convergence:
    r"""
    The convergence criterion of :meth:`DiffMask.fit`.

    A trained layer has converged when, over its last ``patience + 1`` windows
    of ``window`` steps each (steps trained *at that layer*):

    - the mean kept share (expected share of real positions whose gate is open)
      moved by at most ``tol_kept`` from window to window and from the first of
      these windows to the last;
    - the mean multiplier moved by at most ``tol_lambda * max(lambda,
      lambda_floor)``, in the same way (below ``lambda_floor`` a multiplier is
      small: its window means swing with the sampled gates, e.g. 0 to 1.7 on the
      toy task while the kept share and the attributions stay put);
    - the last window's mean KL is at most ``eps * (1 + tol_kl)``;
    - the gates are neither all open (kept share >= ``open_share``) nor all
      closed (kept share <= ``closed_share``: a collapse, or a layer the output
      does not read). All open is never taken for convergence: with the
      constraint slack the gates have not started to close; with the KL near
      eps the fit may be stuck there (the KL of the few gates it samples closed
      holds the multiplier up) or the output may need every position, and the
      two look the same from inside the fit.

    Args:

        window (int, optional): steps per window. Default: 100
        patience (int, optional): consecutive settled window-to-window
                    comparisons required. Default: 3
        tol_kept (float, optional): largest change of the mean kept share.
                    Default: 0.01
        tol_lambda (float, optional): largest relative change of the mean
                    multiplier. Default: 0.5
        lambda_floor (float, optional): the least multiplier the relative
                    change is taken of. Default: 2.0
        tol_kl (float, optional): relative tolerance on eps. Default: 0.25
        open_share (float, optional): kept share counted as "all open".
                    Default: 0.95
        closed_share (float, optional): kept share counted as "all closed".
                    Default: 0.01
    """

    window: int = 100
    patience: int = 3
    tol_kept: float = 0.01
    tol_lambda: float = 0.5
    lambda_floor: float = 2.0
    tol_kl: float = 0.25
    open_share: float = 0.95
    closed_share: float = 0.01

    def __post_init__(self) -> None:
        for name in ("window", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"convergence.{name} must be an int >= 1, got {value!r}")
        for name in ("tol_kept", "tol_lambda", "lambda_floor", "tol_kl", "open_share", "closed_share"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"convergence.{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass
class Window:
    r"""Means over one window of a layer's steps."""

    kl: float
    kept: float
    lam: float
    steps: int


class LayerMonitor:
    r"""
    Accumulates one layer's training steps into windows and judges them.

    Args:

        layer (int): the layer, for messages.
        eps (float): the KL margin of the fit.
        criterion (Convergence): the thresholds.
    """

    def __init__(self, layer: int, eps: float, criterion: Convergence) -> None:
        self.layer, self.eps, self.criterion = layer, float(eps), criterion
        self.windows: List[Window] = []
        self.steps = 0
        self._sums = [0.0, 0.0, 0.0]
        self._count = 0

    def record(self, kl: float, kept: float, lam: float) -> bool:
        r"""Adds one step (mean KL, kept share, multiplier after the step);
        True when it closed a window."""
        self.steps += 1
        self._count += 1
        for i, value in enumerate((kl, kept, lam)):
            self._sums[i] += value
        if self._count < self.criterion.window:
            return False
        n = self._count
        self.windows.append(Window(self._sums[0] / n, self._sums[1] / n, self._sums[2] / n, n))
        self._sums, self._count = [0.0, 0.0, 0.0], 0
        return True

    def _settled(self) -> bool:
        c = self.criterion
        recent = self.windows[-(c.patience + 1):]
        if len(recent) < c.patience + 1:
            return False
        # window to window, and across the whole span: a slow drift that stays
        # under the tolerance at every window still adds up
        pairs = list(zip(recent, recent[1:])) + [(recent[0], recent[-1])]
        for before, after in pairs:
            if abs(after.kept - before.kept) > c.tol_kept:
                return False
            if abs(after.lam - before.lam) > c.tol_lambda * max(after.lam, before.lam, c.lambda_floor):
                return False
        return True

    def status(self) -> str:
        r"""One of :data:`STATUSES`, judged on the closed windows (an
        unfinished window counts when none is closed yet)."""
        last = self._last()
        if last is None:
            return "unsettled"
        c = self.criterion
        if last.kept <= c.closed_share:
            return "closed"
        if last.kl > self.eps * (1 + c.tol_kl):
            return "violated"
        # all open is never "converged", even with the KL near eps: a fit stuck
        # with every gate open (the KL from its few sampled closures holding the
        # multiplier up) looks the same as a model that needs every position
        if last.kept >= c.open_share:
            return "open"
        return "converged" if self._settled() else "unsettled"

    def _last(self) -> Optional[Window]:
        if self.windows:
            return self.windows[-1]
        if self._count:
            n = self._count
            return Window(self._sums[0] / n, self._sums[1] / n, self._sums[2] / n, n)
        return None

    def report(self) -> Dict[str, object]:
        r"""The layer's status with the figures behind it: ``status``,
        ``converged``, ``steps``, and the last two windows' means."""
        status = self.status()
        windows = [asdict(w) for w in self.windows[-2:]]
        if not self.windows and self._last() is not None:
            windows = [asdict(self._last())]  # type: ignore[arg-type]
        return {"layer": self.layer, "status": status, "converged": status == "converged",
                "steps": self.steps, "windows": windows}

    def advice(self) -> str:
        r"""What the status means and what to try, with the figures."""
        status, last = self.status(), self._last()
        if last is None:
            return f"layer {self.layer}: not trained (no step drawn it); raise epochs or max_steps"
        figures = (f"kept share {last.kept:.3f}, KL {last.kl:.4f} (eps {self.eps:g}), "
                   f"lambda {last.lam:.3g}, {self.steps} steps")
        if status == "closed":
            what = ("every gate closed; if the KL is above eps the gates collapsed (no gradient "
                    "reaches a closed gate): try a lower lr or a larger lr_lambda; if the KL is within "
                    "eps, the output does not need this layer's positions")
        elif status == "violated":
            what = "the constraint is still violated: raise the cap (epochs, max_steps) or eps"
        elif status == "open" and last.kl < self.eps * (1 - self.criterion.tol_kl):
            what = ("the gates are still all open while the constraint is slack: the fit has not "
                    "started to close them; raise the cap (epochs, max_steps), or lr, or lower init_bias")
        elif status == "open":
            what = ("the gates are all open with the KL near eps: either the output needs every "
                    "position at this eps, or the fit is stuck with every gate open; to tell, refit "
                    "with another seed or a larger eps (gates that then close were not needed), "
                    "or raise the cap (epochs, max_steps)")
        else:
            moving = ""
            if len(self.windows) >= 2:
                a, b = self.windows[-2], self.windows[-1]
                moving = f" (last two windows: kept {a.kept:.3f} -> {b.kept:.3f}, lambda {a.lam:.3g} -> {b.lam:.3g})"
            what = ("the kept share or the multiplier is still moving" + moving +
                    ": raise the cap (epochs, max_steps)")
        return f"layer {self.layer}: {what}; {figures}"


def warn_unconverged(monitors: Dict[int, LayerMonitor], stopped_by: str = "its cap", stacklevel: int = 3) -> None:
    r"""One :class:`DiffMaskConvergenceWarning` naming what stopped the fit
    (``stopped_by``, e.g. ``"the cap max_steps=150"``) and every layer that has
    not converged, with its figures and what to try; nothing when all have."""
    lines = [m.advice() for _, m in sorted(monitors.items()) if m.status() != "converged"]
    if lines:
        warnings.warn(f"DiffMask.fit stopped at {stopped_by} before every layer converged:\n  " + "\n  ".join(lines),
                      DiffMaskConvergenceWarning, stacklevel=stacklevel)
