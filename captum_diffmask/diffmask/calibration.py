"""eps chosen for the user: the KL margin from a target they understand.

DiffMask's one real knob is eps, in nats, which no user can read.
:func:`calibrate_eps` takes instead the share of the model's predictions the
masked model must keep on held-out data (``agreement``), fits DiffMask at a short
ladder of eps values from the tightest up, each fit warm-started from the one
before (so the ladder costs about one fit and a fraction), scores each rung on
the held-out batches the fits never see, and returns the sparsest rung whose
every layer settled and kept the target, with the whole frontier.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn

from captum_diffmask.diffmask.constrained.convergence import SETTLED

#: The default ladder, in nats: from about the SST suite's tightest to the paper's SST bound.
LADDER = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


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
    **fit_options: Any,
) -> EpsCalibration:
    r"""
    The sparsest eps on ``ladder`` whose masks keep the model's prediction on
    at least ``agreement`` of the held-out examples at every layer.

    The rungs are fitted from the tightest up, each warm-started from the probe
    of the one before; each is scored on ``held_out`` with deterministic gates
    (:meth:`DiffMask.evaluate`). The climb stops at the first rung that misses
    the target or whose probes do not all settle: the rung before is the
    answer (a looser eps keeps less).

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
        train, held_out = text_batches(train, tokenizer), text_batches(held_out, tokenizer)
    dm = DiffMask(model, mode=mode, **dict(explainer_options or {}))
    result, chosen = EpsCalibration(None, float(agreement)), None
    for eps in rungs:
        start = time.perf_counter()
        dm.fit(train, eps=eps, **fit_options)
        seconds = time.perf_counter() - start
        for layer, scores in sorted(dm.evaluate(held_out, fit_options.get("layers")).items()):
            result.frontier.append({"eps": eps, "layer": layer, "agreement": scores["agreement"], "kl": scores["kl"],
                                    "masked": 1.0 - scores["l0"], "verdict": dm.convergence[layer]["status"],
                                    "seconds": seconds})
        if not result.meets(eps):
            result.reason = _missed(result, eps, chosen)
            break
        chosen = (eps, copy.deepcopy(dm.probe.state_dict()), copy.deepcopy(dm.lambdas.state_dict()),
                  copy.deepcopy(dm.convergence))
    else:
        result.reason = f"every rung up to eps {rungs[-1]:g} met the target: the ladder may stop too early"
    if chosen is not None:
        dm.restore_probe(dm.site_sizes, chosen[1], chosen[2])
        dm.convergence = chosen[3]
        result.eps, result.explainer = chosen[0], dm
    return result


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
        return f"no rung meets the target: the tightest, eps {eps:g}, misses it ({why}); try a tighter ladder"
    return f"eps {chosen[0]:g} is the sparsest rung that meets the target; the next, eps {eps:g}, misses it ({why})"
