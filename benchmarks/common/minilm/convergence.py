"""The MiniLM suites' convergence table: per fit and layer, where DiffMask's fit
stood when it stopped."""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Tuple

from captum_diffmask.diffmask.constrained.convergence import SETTLED
from captum_diffmask.diffmask.fit.history import last_rows

from benchmarks.report import fmt, table
from benchmarks.common.minilm.fitting import HELD_OUT_MARGIN


def probe_counts(status: str, heldout_kl: Optional[float], eps: Optional[float]) -> Tuple[bool, bool]:
    r"""
    Whether one probe (a fit's layer) counts toward a conclusion, in two parts.

    Args:

        status (str): the fit's own verdict at the layer.
        heldout_kl (float, optional): its deterministic read-out's KL on the
                    held-out train sentences; None when the run scored none (a
                    selected checkpoint's run).
        eps (float, optional): the fit's eps; None: unknown.

    Returns:
        *tuple* ``(settled, within)``: the verdict is ``converged`` or
        ``needed``; the held-out KL is at most :data:`HELD_OUT_MARGIN` x eps
        (True where either is unknown). A probe counts when both hold.
    """
    within = heldout_kl is None or eps is None or float(heldout_kl) <= HELD_OUT_MARGIN * float(eps)
    return status in SETTLED, within


def certificate_cell(layer: Mapping[str, Any]) -> str:
    r"""One probe's certificate in a table cell: its drift and whether it counts
    (with the reasons when it does not)."""
    drift = (f"{fmt(layer['masked_before'], 3)} -> {fmt(layer['masked_after'], 3)} / {fmt(layer['keep_change'], 3)} / "
             f"{fmt(layer['kl_before'], 4)} -> {fmt(layer['kl_after'], 4)}")
    return f"{drift}: **counts**" if layer["counted"] else f"{drift}: no ({'; '.join(layer['reasons'])})"


def convergence_section(dm: Mapping[str, Any]) -> List[str]:
    r"""Per fit and layer: the convergence status at the end of the fit and the
    last window's means (``DiffMask.convergence``); empty for runs made before
    fit reported it."""
    rows, held_out, certified = [], False, False
    for mode in ("input", "hidden"):
        for run in dm[mode]["runs"]:
            certificate = (run.get("certificate") or {}).get("layers", {})
            certified = certified or bool(certificate)
            eps = float(run.get("options", {}).get("eps", math.nan))
            last_epoch = last_rows(run.get("history") or [])
            for layer, report in sorted((run.get("convergence") or {}).items(), key=lambda item: int(item[0])):
                last = report["windows"][-1] if report["windows"] else {}
                row = [mode, run["seed"], layer, f"**{report['status']}**", report["steps"], fmt(last.get("kept"), 3),
                       fmt(last.get("kl"), 4), fmt(last_epoch.get(int(layer), {}).get("kl"), 4),
                       fmt(last_epoch.get(int(layer), {}).get("kl_deployed"), 4),
                       fmt(last.get("lam"), 3)]
                if run.get("heldout"):
                    held_out = True
                    kl = run["heldout"][str(layer)]["kl"]
                    row.append(f"{fmt(kl, 4)} {'ok' if kl <= HELD_OUT_MARGIN * eps else 'over'}")
                if str(layer) in certificate:
                    row.append(certificate_cell(certificate[str(layer)]))
                rows.append(row)
    if not rows:
        return []
    headers = ["mode", "seed", "layer", "status", "steps", "kept share", "KL (constraint)", "KL sampled (last epoch)",
               "KL deployed (last epoch)",
               "lambda"] + ([f"held-out deterministic KL (<= eps x {HELD_OUT_MARGIN:g})"] if held_out else []) + \
        (["certificate: masked share / keep change / KL after further steps"] if certified else [])
    return ["## Convergence per layer", "",
            "Where each fit stood when it stopped (`DiffMask.convergence`): the layer's status, the steps "
            "trained at it, and the means of its last window of steps (kept share of the training gates, the "
            "constraint the multiplier held, multiplier); the last epoch's mean KL of the sampled (trained) and of "
            "the deterministic (deployed) gates, whose difference is the gap between what is trained and what "
            "`attribute` reads out; "
            "without checkpoint selection, the deterministic read-out's KL on the held-out train sentences. "
            "`converged`: the kept share and the multiplier settled and the constraint within eps x 1.25; "
            "`needed`: every gate open because closing the positions the probe ranks least needed breaks the "
            "constraint; `unsettled`: still moving when the cap came; `violated`: the constraint above eps x "
            "1.25; `open`: every gate open without that measurement; `closed` / `collapsed`: every gate closed, "
            "within the constraint / with it broken. The certificate (`captum_diffmask.certify`, where measured): "
            "the probe trained further with nothing frozen, its held-out drift; **counts** when within the "
            "tolerances fixed in advance (its JSON holds them).", "",
            table(headers, [r + [""] * (len(headers) - len(r)) for r in rows]), ""]
