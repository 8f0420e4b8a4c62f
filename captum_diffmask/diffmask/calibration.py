"""eps chosen for the user: the KL margin from a target they understand.

DiffMask's one real knob is eps, in nats, which no user can read.
:func:`calibrate_eps` takes instead the share of the model's predictions the
masked model must keep on held-out data (``agreement``), fits DiffMask at the
middle of a short ladder of eps values, then walks looser while the rungs keep
the target (or tighter until one does), each fit warm-started from the one
before, scores each rung on the held-out batches the fits never see, and
returns the sparsest rung whose every layer settled and kept the target, with
the frontier it walked.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn

from captum_diffmask.diffmask.constrained.convergence import Convergence, SETTLED

#: The default ladder, in nats: from about the SST suite's tightest to the paper's SST bound.
LADDER = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: The windows of the criterion a warm-started rung has to settle in: half a
#: cold fit's budget (:class:`Convergence`'s ``max_windows``). A rung that has
#: not settled does not count, so a cap that binds leaves its eps unmeasured;
#: a rung that settles sooner stops sooner.
WARM_WINDOWS = Convergence().max_windows // 2


@dataclass
class EpsCalibration:
    r"""
    What :func:`calibrate_eps` found.

    Attributes:
        eps (float, optional): the sparsest rung that meets the target at every
                    layer with every probe settled; None when no rung does.
        agreement (float): the target: the share of held-out examples whose
                    masked argmax must equal the original's, at every layer.
        frontier (list of dict): a row per (rung, layer): ``eps``, ``layer``,
                    ``agreement``, ``kl`` (nats), ``masked`` (share of real
                    positions dropped), ``verdict`` and ``seconds`` (the rung's
                    fit), all on the held-out batches but the verdict and time.
        reason (str): why this eps, or why none.
        explainer (DiffMask, optional): fitted at :attr:`eps` (None when none).
    """

    eps: Optional[float]
    agreement: float
    frontier: List[Dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    explainer: Any = None

    def rungs(self) -> List[float]:
        r"""The eps values fitted, tightest first."""
        return sorted({row["eps"] for row in self.frontier})

    def meets(self, eps: float) -> bool:
        r"""Whether the rung ``eps`` kept the target with every probe settled."""
        rows = [row for row in self.frontier if row["eps"] == eps]
        return bool(rows) and all(r["agreement"] >= self.agreement and r["verdict"] in SETTLED for r in rows)

    def to_dict(self) -> Dict[str, Any]:
        r"""Plain values (JSON-ready): the eps, the target, the reason and the frontier."""
        return {"eps": self.eps, "agreement": self.agreement, "reason": self.reason,
                "frontier": [dict(row) for row in self.frontier]}

    def plot(self, path: Optional[str] = None) -> Figure:
        r"""Held-out agreement and masked share over eps, a line per layer, the
        target dashed and the chosen eps marked; saved as PNG at ``path``."""
        figure = Figure(figsize=(8, 3.2))
        FigureCanvasAgg(figure)
        left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
        for layer in sorted({row["layer"] for row in self.frontier}):
            rows = sorted((r for r in self.frontier if r["layer"] == layer), key=lambda r: r["eps"])
            eps = [r["eps"] for r in rows]
            left.plot(eps, [r["agreement"] for r in rows], marker="o", label=f"layer {layer}")
            right.plot(eps, [r["masked"] for r in rows], marker="o", label=f"layer {layer}")
        left.axhline(self.agreement, linestyle="--", color="grey", label="target")
        for axes, name in ((left, "held-out agreement"), (right, "masked share")):
            axes.set_xscale("log")
            axes.set_xlabel("eps (nats)")
            axes.set_ylabel(name)
            if self.eps is not None:
                axes.axvline(self.eps, color="black", linewidth=0.8)
        left.legend(fontsize=7)
        figure.tight_layout()
        if path is not None:
            figure.savefig(path, dpi=120)
        return figure


def calibrate_eps(
    model: nn.Module,
    train: Iterable[Any],
    held_out: Iterable[Any],
    mode: str = "input",
    agreement: float = 0.95,
    ladder: Sequence[float] = LADDER,
    tokenizer: Any = None,
    explainer_options: Optional[Mapping[str, Any]] = None,
    warm_windows: int = WARM_WINDOWS,
    **fit_options: Any,
) -> EpsCalibration:
    r"""
    The sparsest eps on ``ladder`` whose masks keep the model's prediction on
    at least ``agreement`` of the held-out examples at every layer.

    The middle rung is fitted first; then the walk goes looser while the rungs
    meet the target (the last that does is the answer) or tighter until one
    does (the first that does is the answer), each rung warm-started from the
    probe of the one before and scored on ``held_out`` with deterministic
    gates (:meth:`DiffMask.evaluate`). A rung meets the target when every
    layer keeps ``agreement`` with its probe settled. A warm rung starts from a
    trained probe, so it gets ``warm_windows`` windows of the criterion to
    settle (the criterion's ``max_windows``), not a cold fit's budget.

    Args:

        model (nn.Module): the model to explain.
        train: what :meth:`DiffMask.fit` takes (batches, or texts with ``tokenizer``).
        held_out: the same kind, never fitted on: where each rung is scored.
        mode (str, optional): ``"input"`` or ``"hidden"``. Default: ``"input"``
        agreement (float, optional): the share of held-out predictions to keep,
                    in (0, 1]. Default: 0.95
        ladder (sequence of float, optional): the eps values tried. Default: :data:`LADDER`
        tokenizer (optional): for texts, as :meth:`DiffMask.fit` takes it.
        explainer_options (mapping, optional): the constructor's other
                    arguments (``sites``, ``forward_func``, ...). Default: None
        warm_windows (int, optional): the windows of steps a warm-started rung
                    has to settle. Default: :data:`WARM_WINDOWS`
        **fit_options: :meth:`DiffMask.fit`'s options but ``eps`` (``layers``,
                    ``seed``, ``max_steps``, ...).

    Returns:
        :class:`EpsCalibration`: ``eps`` (None when no rung meets the target,
        with the reason), the frontier and the explainer fitted at ``eps``.
    """
    from captum_diffmask.diffmask.explainer import DiffMask
    from captum_diffmask.model.texts import text_batches

    rungs = _checked(agreement, ladder, fit_options)
    if tokenizer is not None:
        train, held_out = text_batches(train, tokenizer, by_length=True), text_batches(held_out, tokenizer, by_length=True)
    dm = DiffMask(model, mode=mode, **dict(explainer_options or {}))
    result = EpsCalibration(None, float(agreement))
    walk = _Walk(dm, train, held_out, result, fit_options, warm_windows)
    index = (len(rungs) - 1) // 2
    step = 1 if walk.fit(rungs[index]) else -1
    while 0 <= index + step < len(rungs) and walk.met[-1] == (step == 1):
        index += step
        walk.fit(rungs[index])
    walk.finish(rungs)
    return result


class _Walk:
    r"""The rungs :func:`calibrate_eps` fits, in order, and the probe of each
    that meets the target."""

    def __init__(self, dm: Any, train: Any, held_out: Any, result: EpsCalibration, fit_options: Mapping[str, Any],
                 warm_windows: int) -> None:
        if isinstance(warm_windows, bool) or not isinstance(warm_windows, int) or warm_windows < 4:
            raise ValueError(f"warm_windows must be an int >= 4 (the criterion's patience + 1), got {warm_windows!r}")
        self.dm, self.train, self.held_out, self.result = dm, train, held_out, result
        self.options, self.warm_windows = dict(fit_options), warm_windows
        self.met: List[bool] = []
        self.kept: Dict[float, tuple] = {}

    def fit(self, eps: float) -> bool:
        r"""Fits and scores the rung ``eps``; whether it meets the target."""
        options = dict(self.options)
        if self.met:  # warm: the probe has learnt its ranking, a few windows settle it
            convergence = dict(options.get("convergence") or {})
            convergence.setdefault("max_windows", self.warm_windows)
            options["convergence"] = convergence
        start = time.perf_counter()
        self.dm.fit(self.train, eps=eps, **options)
        seconds = time.perf_counter() - start
        for layer, scores in sorted(self.dm.evaluate(self.held_out, self.options.get("layers")).items()):
            self.result.frontier.append({"eps": eps, "layer": layer, "agreement": scores["agreement"], "kl": scores["kl"],
                                         "masked": 1.0 - scores["l0"], "verdict": self.dm.convergence[layer]["status"],
                                         "seconds": seconds})
        self.met.append(self.result.meets(eps))
        if self.met[-1]:
            self.kept[eps] = (copy.deepcopy(self.dm.probe.state_dict()), copy.deepcopy(self.dm.lambdas.state_dict()),
                              copy.deepcopy(self.dm.convergence))
        return self.met[-1]

    def finish(self, rungs: Sequence[float]) -> None:
        r"""The answer (the sparsest rung that met the target), its probe
        restored, and the reason."""
        result, result_rungs = self.result, self.result.rungs()
        chosen = max(self.kept) if self.kept else None
        if chosen is None:
            result.reason = _missed(result, result_rungs[0], None)
            return
        looser = [eps for eps in result_rungs if eps > chosen]
        if looser:
            result.reason = _missed(result, looser[0], (chosen,))
        else:
            result.reason = f"every rung up to eps {rungs[-1]:g} met the target: the ladder may stop too early"
        probe, lambdas, convergence = self.kept[chosen]
        self.dm.restore_probe(self.dm.site_sizes, probe, lambdas)
        self.dm.convergence = convergence
        result.eps, result.explainer = chosen, self.dm


def _checked(agreement: float, ladder: Sequence[float], fit_options: Mapping[str, Any]) -> List[float]:
    if not 0.0 < float(agreement) <= 1.0:
        raise ValueError(f"agreement must be in (0, 1], got {agreement!r}")
    rungs = sorted(float(eps) for eps in ladder)
    if not rungs or rungs[0] <= 0:
        raise ValueError(f"ladder must hold eps values > 0, got {list(ladder)!r}")
    if "eps" in fit_options:
        raise ValueError("eps is what calibrate_eps chooses: give ladder=, not eps=")
    return rungs


def _missed(result: EpsCalibration, eps: float, chosen: Optional[tuple]) -> str:
    rows = [row for row in result.frontier if row["eps"] == eps]
    unsettled = [f"{r['layer']} ({r['verdict']})" for r in rows if r["verdict"] not in SETTLED]
    low = [f"{r['layer']} ({r['agreement']:.3f})" for r in rows if r["agreement"] < result.agreement]
    why = "; ".join(part for part in (f"layers not settled: {', '.join(unsettled)}" if unsettled else "",
                                      f"agreement below {result.agreement:g} at layers {', '.join(low)}" if low else "")
                    if part)
    if chosen is None:
        return f"no rung meets the target: the tightest, eps {eps:g}, misses it ({why}); {_what_to_raise(low)}"
    return (f"eps {chosen[0]:g} is the sparsest rung that meets the target; the next, eps {eps:g}, misses it "
            f"({why})" + ("" if low else f"; {_what_to_raise(low)}"))


def _what_to_raise(low: Sequence[str]) -> str:
    r"""The advice for a rung that missed: a rung whose every layer kept the
    agreement missed only because a probe had not settled, and a tighter eps
    would not settle it sooner."""
    if low:
        return "try a tighter ladder"
    return ("it keeps the agreement at every layer and missed only because its probes did not settle: give the fits "
            "more steps (raise max_steps or epochs, or convergence's max_windows; warm rungs: warm_windows), "
            "not a tighter ladder")
