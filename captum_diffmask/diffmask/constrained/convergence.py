"""When a DiffMask fit has converged, and what to say when it has not.

A fit is a game between the gates (closing as many positions as they can) and
one Lagrange multiplier per layer (holding the KL within eps). It has converged
at a layer when both have stopped moving and the constraint holds. The steps
trained at a layer are grouped in windows of ``window`` steps; the window means
of the kept share, the multiplier and the KL are compared window to window.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from captum_diffmask.diffmask.constrained.constraint import KLConstraint

#: A layer's states at the end of a fit (``collapsed``: every gate closed with the
#: constraint violated; ``closed``: every gate closed within it).
STATUSES = ("converged", "needed", "unsettled", "violated", "open", "closed", "collapsed")
#: The statuses that end a layer's fit with a verdict (no warning): the gates
#: settled within the constraint, or every gate open because the output needs
#: the positions (see :class:`Convergence`).
SETTLED = ("converged", "needed")


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
      these windows to the last, plus ``noise`` standard errors of the
      difference (batches differ: on SST with batches of 32 two windows of a
      settled probe differ by ~0.01 from the batches alone);
    - the mean multiplier moved by at most ``tol_lambda * max(lambda,
      lambda_floor)``, in the same way (below ``lambda_floor`` a multiplier is
      small: its window means swing with the sampled gates, e.g. 0 to 1.7 on the
      toy task while the kept share and the attributions stay put);
    - the constraint's mean over these windows (steps weighted) is at most
      ``eps * (1 + tol_kl)``;
    - the gates are not all closed (kept share <= ``closed_share``: a
      collapse, or a layer the output does not read).

    All open (kept share >= ``open_share``) is a verdict of its own,
    ``"needed"``, when it is measured to be the answer: while a layer's gates
    are all open, every step also closes the ``1 - open_share`` share of the
    batch's real positions that the probe ranks least needed (deterministic
    gates) and records the KL. When that closure breaks the constraint
    (window mean above ``eps * (1 + tol_kl)``), the gates have been all open
    for ``needed_windows`` windows (time for the probe to learn its ranking)
    and the layer has settled, no gate the probe can tell apart can close:
    the output needs the positions (e.g. the embeddings of a toy sequence
    before the query is read: on the toy task, input mode, vote 0 stays open
    with its own multiplier at its floor, held by the later layers whose
    gates it is a factor of). Otherwise the layer is ``"open"``: the gates
    could close and have not, or have not been open long enough to tell.

    A fit stops at the latest after ``max_windows`` windows of steps at each
    layer (``budget``; with a cool-down, the cool-down begins there at the
    latest and the fit stops after its steps), so that a fit that cannot
    converge ends in bounded time and says so. What the fit does with the
    verdicts: it stops once every trained layer has one (``until_converged``),
    and a layer whose probe is its own stops training once it has its own
    (``freeze_converged``).

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
        max_windows (int, optional): the windows of steps per layer after
                    which a fit stops unconverged, when no cap is given; with
                    a cool-down, after which the cool-down begins whether or
                    not every layer has its verdict (a cap given still ends
                    the fit). Default: 40
        needed_windows (int, optional): the windows a layer's gates must have
                    been all open before ``"needed"`` can be said: a probe needs
                    some hundred steps to learn which positions it may close
                    (on the toy task's input mode gates start closing after
                    ~400, and one fit on the toy grid only after ~1 000), and until
                    then its ranking is a guess. Default: 20
        noise (float, optional): how many standard errors of the difference
                    of two window means (from the steps' spread within each
                    window) a change may add to ``tol_kept`` and to the
                    multiplier's tolerance; 0 compares the means alone.
                    Default: 2.0
        until_converged (bool, optional): stop the fit once every trained
                    layer has its verdict; False: run to the caps
                    (``max_steps``, ``epochs``). Default: True
        cooldown (int, optional): once every trained layer has its verdict,
                    train every layer (nothing frozen) this many further
                    steps with the probe's and the multipliers' rates times
                    ``cooldown_factor``, and on, window by window, until
                    every verdict holds again on the cool-down's own windows
                    (or a cap ends the fit, which then says which layers did
                    not settle); it begins at the criterion's budget at the
                    latest, so that a layer whose multiplier still cycles at
                    the fit's rates is damped too. At the fit's rates a settled
                    probe still jitters around its answer: on SST at eps 0.01
                    the certificate going on from the fit's own state counts
                    2 of 7 depths (masked share moved up to 0.067), two
                    continuations with fresh optimiser states end up to 0.044
                    apart (``docs/results/certificate-noise.md``); after a
                    cool-down at a tenth of the rates it counts 6 of 7 (the
                    seventh a trend it still sees). Steps at each layer (with
                    one layer drawn per batch, the fit's steps are that many
                    times the layers); at least ``(patience + 1) * window``, so
                    that the verdicts rest on the cool-down's windows alone;
                    0: no cool-down.
                    Default: 0
        cooldown_factor (float, optional): the rates' factor in the cool-down,
                    in (0, 1]. Default: 0.1
        freeze_converged (bool, optional): where each layer's gate networks,
                    baselines and multiplier are its own (hidden and component
                    modes; input mode with ``votes="per_depth"``), stop training
                    a layer once it has its verdict, keeping the probe the
                    verdict was judged on, while the others go on (with
                    ``until_converged``). Without it a settled layer keeps
                    training until every layer has settled at once, and its
                    window means can drift out of the criterion again.
                    Default: True
    """

    window: int = 100
    patience: int = 3
    tol_kept: float = 0.01
    tol_lambda: float = 0.5
    lambda_floor: float = 2.0
    tol_kl: float = 0.25
    open_share: float = 0.95
    closed_share: float = 0.01
    max_windows: int = 40
    noise: float = 2.0
    needed_windows: int = 20
    cooldown: int = 0
    cooldown_factor: float = 0.1
    until_converged: bool = True
    freeze_converged: bool = True

    @property
    def budget(self) -> int:
        r"""The steps at a layer after which a fit with no cap of its own stops."""
        return self.window * self.max_windows

    def __post_init__(self) -> None:
        if isinstance(self.max_windows, bool) or not isinstance(self.max_windows, int) or self.max_windows <= self.patience:
            raise ValueError(f"convergence.max_windows must be an int > patience ({self.patience}), "
                             f"got {self.max_windows!r}")
        for name in ("window", "patience", "needed_windows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"convergence.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.cooldown, bool) or not isinstance(self.cooldown, int) or self.cooldown < 0:
            raise ValueError(f"convergence.cooldown must be an int >= 0, got {self.cooldown!r}")
        if 0 < self.cooldown < (self.patience + 1) * self.window:
            raise ValueError(f"convergence.cooldown must be 0 or at least (patience + 1) * window = "
                             f"{(self.patience + 1) * self.window} steps (the verdicts are judged on its windows), "
                             f"got {self.cooldown}")
        if not 0 < self.cooldown_factor <= 1:
            raise ValueError(f"convergence.cooldown_factor must be in (0, 1], got {self.cooldown_factor!r}")
        for name in ("tol_kept", "tol_lambda", "lambda_floor", "tol_kl", "open_share", "closed_share", "noise"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"convergence.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("until_converged", "freeze_converged"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")


@dataclass
class Window:
    r"""Means over one window of a layer's steps; ``closure``: the mean KL with
    the least-needed positions closed, over the steps that measured it (None
    when none did); ``kept_sd``, ``lam_sd``: the spread of the steps' kept
    share and multiplier within the window."""

    kl: float
    kept: float
    lam: float
    steps: int
    closure: Optional[float] = None
    kept_sd: float = 0.0
    lam_sd: float = 0.0


class LayerMonitor:
    r"""
    Accumulates one layer's training steps into windows and judges them.

    Args:

        layer (int): the layer, for messages.
        constraint (KLConstraint): the fit's constraint (its eps).
        criterion (Convergence): the thresholds.
        lambda_max (float, optional): the multiplier's ceiling, for the advice
                    when the multiplier sits at it. Default: None
    """

    def __init__(self, layer: int, constraint: KLConstraint, criterion: Convergence,
                 lambda_max: Optional[float] = None) -> None:
        self.layer, self.constraint, self.criterion = layer, constraint, criterion
        self.lambda_max = lambda_max
        self.windows: List[Window] = []
        self.steps = 0
        self._sums = [0.0, 0.0, 0.0]
        self._squares = [0.0, 0.0]  # of the kept share and the multiplier
        self._count = 0
        self._closure = [0.0, 0]  # sum and count of the steps that measured it

    def record(self, kl: float, kept: float, lam: float, closure: Optional[float] = None) -> bool:
        r"""Adds one step (the constraint's value, kept share, multiplier after
        the step and, when measured, the KL with the least-needed positions
        closed); True when it closed a window."""
        self.steps += 1
        self._count += 1
        for i, value in enumerate((kl, kept, lam)):
            self._sums[i] += value
        self._squares[0] += kept * kept
        self._squares[1] += lam * lam
        if closure is not None:
            self._closure[0] += float(closure)
            self._closure[1] += 1
        if self._count < self.criterion.window:
            return False
        self.windows.append(self._current())
        self._sums, self._squares, self._count, self._closure = [0.0, 0.0, 0.0], [0.0, 0.0], 0, [0.0, 0]
        return True

    def state_dict(self) -> Dict[str, Any]:
        r"""The monitor's state as plain values (a fit state holds no pickled
        objects): its windows and the running sums of the open window."""
        return {"windows": [asdict(w) for w in self.windows], "steps": self.steps, "sums": list(self._sums),
                "squares": list(self._squares), "count": self._count, "closure": list(self._closure)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        r"""Restores a :meth:`state_dict`."""
        self.windows = [Window(**window) for window in state["windows"]]
        self.steps, self._count = int(state["steps"]), int(state["count"])
        self._sums = [float(v) for v in state["sums"]]
        self._squares = [float(v) for v in state["squares"]]
        self._closure = [float(state["closure"][0]), int(state["closure"][1])]

    def _current(self) -> Window:
        n, (total, measured) = self._count, self._closure
        closure = total / measured if measured else None
        means = [value / n for value in self._sums]
        spreads = [math.sqrt(max(square / n - mean * mean, 0.0)) for square, mean in zip(self._squares, means[1:])]
        return Window(means[0], means[1], means[2], n, closure, spreads[0], spreads[1])

    def measures_closure(self) -> bool:
        r"""Whether the next step should measure the closure of the least-needed
        positions: while the layer's gates are all open (by the last closed
        window's kept share; not in the first window, while the gates have
        only started from open)."""
        return bool(self.windows) and self.windows[-1].kept >= self.criterion.open_share

    def _settled(self) -> bool:
        c = self.criterion
        recent = self.windows[-(c.patience + 1):]
        if len(recent) < c.patience + 1:
            return False
        # window to window, and across the whole span: a slow drift that stays
        # under the tolerance at every window still adds up. A change within
        # `noise` standard errors of the difference of two window means is the
        # batches' noise (one batch keeps more than another), not a trend.
        for before, after in _judged_pairs(recent):
            if abs(after.kept - before.kept) > c.tol_kept + c.noise * _standard_error(before, after, "kept_sd"):
                return False
            scale = c.tol_lambda * max(after.lam, before.lam, c.lambda_floor)
            if abs(after.lam - before.lam) > scale + c.noise * _standard_error(before, after, "lam_sd"):
                return False
        return True

    def _recent_kl(self) -> float:
        r"""The constraint's mean over the windows the settling is judged on
        (the last ``patience + 1``; fewer while there are fewer), weighted by
        their steps: one window's mean swings with a few costly batches."""
        recent = self.windows[-(self.criterion.patience + 1):] or [self._current()]
        return sum(w.kl * w.steps for w in recent) / sum(w.steps for w in recent)

    def status(self) -> str:
        r"""One of :data:`STATUSES`, judged on the closed windows (an
        unfinished window counts when none is closed yet)."""
        last = self._last()
        if last is None:
            return "unsettled"
        c = self.criterion
        violated = self.constraint.exceeds(self._recent_kl(), c.tol_kl)
        if last.kept <= c.closed_share:
            return "collapsed" if violated else "closed"
        if violated:
            return "violated"
        if last.kept >= c.open_share:
            # all open is a verdict only when closing the positions the probe
            # ranks least needed is measured to break the constraint
            if self._needs_everything(last) and self._settled():
                return "needed"
            return "open"
        return "converged" if self._settled() else "unsettled"

    def _needs_everything(self, window: Window) -> bool:
        r"""Closing the least-needed positions breaks the constraint, and the
        gates have been all open for ``needed_windows`` windows (before, the
        probe's ranking may be untrained, and closing its "least needed"
        positions closes random ones)."""
        c = self.criterion
        recent = self.windows[-c.needed_windows:]
        return (self._closure_breaks(window) and len(recent) == c.needed_windows
                and all(w.kept >= c.open_share for w in recent))

    def _closure_breaks(self, window: Window) -> bool:
        return window.closure is not None and self.constraint.exceeds(window.closure, self.criterion.tol_kl)

    def _last(self) -> Optional[Window]:
        if self.windows:
            return self.windows[-1]
        if self._count:
            return self._current()
        return None

    def report(self) -> Dict[str, object]:
        r"""The layer's status with the figures behind it: ``status``,
        ``converged``, ``steps``, and the last two windows' means."""
        status = self.status()
        windows = [asdict(w) for w in self.windows[-2:]]
        if not self.windows and self._last() is not None:
            windows = [asdict(self._last())]  # type: ignore[arg-type]
        return {"layer": self.layer, "status": status, "converged": status in SETTLED,
                "steps": self.steps, "windows": windows}

    def _at_ceiling(self, lam: float) -> bool:
        r"""Whether a window's mean multiplier sat at its ceiling (within 5 %)."""
        return self.lambda_max is not None and lam >= 0.95 * self.lambda_max

    def advice(self) -> str:
        r"""What the status means and what to try, with the figures."""
        status, last = self.status(), self._last()
        if last is None:
            return f"layer {self.layer}: not trained (no step drawn it); raise epochs or max_steps"
        # means over the last window, which the verdict judges: the progress log's
        # figures are the last epoch's, so the two may differ while the fit moves
        figures = (f"means over the last {last.steps} steps: kept share {last.kept:.3f}, KL {last.kl:.4f} "
                   f"(eps {self.constraint.eps:g}), lambda {last.lam:.3g}; {self.steps} steps in all")
        if status in ("collapsed", "violated") and self._at_ceiling(last.lam):
            what = (f"the constraint is violated with the multiplier at its ceiling (lambda_max "
                    f"{self.lambda_max:g}): the sparsity term outweighs all it can hold. Raise optimization "
                    "lambda_max; with the paper's sum L0 (l0=\"expected\") on long inputs, the default share "
                    "of kept positions (DiffMask(..., l0=\"mean\")) needs a multiplier 1 / length as large "
                    "(docs/guide/diffmask.md)")
        elif status == "collapsed":
            what = ("every gate closed with the constraint violated: the gates collapsed (no gradient "
                    "reaches a closed gate); try a lower lr or a larger lr_lambda")
        elif status == "closed":
            what = ("every gate closed within the constraint: the output does not look to need this "
                    "layer's positions (not counted as converged)")
        elif status == "violated":
            what = "the constraint is still violated: raise the cap (epochs, max_steps) or eps"
        elif status == "open" and last.closure is not None:
            share = f"{1 - self.criterion.open_share:.0%}"
            if self._closure_breaks(last):
                what = (f"the gates are all open and closing the {share} of positions the probe ranks least needed "
                        f"breaks the constraint (KL {last.closure:.4f}): the output looks to need every position, "
                        f"but the layer has not settled, or not been all open for {self.criterion.needed_windows} "
                        "windows (an untrained ranking); raise the cap (epochs, max_steps)")
            else:
                what = (f"the gates are all open, but closing the {share} of positions the probe ranks least "
                        f"needed keeps the constraint (KL {last.closure:.4f}): they could close and have not "
                        "(stuck open); raise the cap (epochs, max_steps), or lr, or lower init_bias")
        elif status == "open" and self.constraint.is_slack(last.kl, self.criterion.tol_kl):
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


def _judged_pairs(recent: Sequence[Window]) -> List[Tuple[Window, Window]]:
    r"""The pairs of windows a verdict compares: each with the next, and the
    first with the last."""
    return list(zip(recent, recent[1:])) + [(recent[0], recent[-1])]


def _lambda_move(before: Window, after: Window, c: Convergence) -> float:
    r"""How far the mean multiplier moved between two windows, beyond ``noise``
    standard errors of the difference, relative to max(lambda, ``lambda_floor``):
    the least ``tol_lambda`` under which the pair passes."""
    beyond_noise = max(abs(after.lam - before.lam) - c.noise * _standard_error(before, after, "lam_sd"), 0.0)
    scale = max(after.lam, before.lam, c.lambda_floor)
    return beyond_noise / scale if scale > 0 else (math.inf if beyond_noise > 0 else 0.0)


def least_tol_lambda(windows: Sequence[Window], criterion: Convergence) -> Optional[float]:
    r"""
    The least ``tol_lambda`` under which the multiplier's part of the settling
    test passes on the last ``patience + 1`` of ``windows``: how close to its
    tolerance a verdict judged on them came.

    Args:

        windows (sequence of Window): a layer's closed windows, oldest first.
        criterion (Convergence): gives ``patience``, ``noise`` and ``lambda_floor``.

    Returns:
        *float*, or None with fewer than ``patience + 1`` windows.
    """
    recent = list(windows[-(criterion.patience + 1):])
    if len(recent) < criterion.patience + 1:
        return None
    return max(_lambda_move(before, after, criterion) for before, after in _judged_pairs(recent))


def _standard_error(a: Window, b: Window, spread: str) -> float:
    r"""The standard error of the difference of two window means."""
    return math.sqrt(getattr(a, spread) ** 2 / a.steps + getattr(b, spread) ** 2 / b.steps)


def warn_unconverged(monitors: Dict[int, LayerMonitor], stopped_by: str = "its cap", stacklevel: int = 3) -> None:
    r"""One :class:`DiffMaskConvergenceWarning` naming what stopped the fit
    (``stopped_by``, e.g. ``"the cap max_steps=150"``) and every layer that has
    not converged, with its figures and what to try; nothing when all have."""
    lines = [m.advice() for _, m in sorted(monitors.items()) if m.status() not in SETTLED]
    if lines:
        warnings.warn(f"DiffMask.fit stopped at {stopped_by} before every layer converged:\n  " + "\n  ".join(lines),
                      DiffMaskConvergenceWarning, stacklevel=stacklevel)
