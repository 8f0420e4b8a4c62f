"""The MiniLM suites' convergence table: per fit and layer, where DiffMask's fit
stood when it stopped."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

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


#: The bands of the multiplier's last move (a share of its scale) the
#: tolerance section counts probes in; the criterion allows up to 0.5.
MULTIPLIER_BANDS = (0.1, 0.25, 0.5)


def multiplier_move(report: Mapping[str, Any], floor: float = 2.0) -> Optional[float]:
    r"""How far a settled layer's multiplier moved between its last two windows,
    as a share of its scale ``max(lambda, floor)`` (the criterion's
    ``tol_lambda`` measures the same); None with fewer than two windows."""
    windows = report.get("windows") or []
    if len(windows) < 2:
        return None
    before, after = float(windows[-2]["lam"]), float(windows[-1]["lam"])
    return abs(after - before) / max(before, after, floor)


def multiplier_tolerance_section(dm: Mapping[str, Any]) -> List[str]:
    r"""Is the criterion's 50 % tolerance on the multiplier too loose? Every
    converged probe with a certificate, by how far its multiplier moved at the
    end (:func:`multiplier_move`), and how many of each band the certificate
    counts: a loose tolerance shows as probes in the upper bands that further
    training moves. Empty without certificates."""
    bands: Dict[str, List[bool]] = {}
    for mode in ("input", "hidden"):
        for run in dm[mode]["runs"]:
            certificate = (run.get("certificate") or {}).get("layers", {})
            for layer, report in (run.get("convergence") or {}).items():
                move = multiplier_move(report)
                if report["status"] != "converged" or move is None or str(layer) not in certificate:
                    continue
                upper = next((b for b in MULTIPLIER_BANDS if move <= b), None)
                name = f"<= {upper:.0%}" if upper is not None else f"> {MULTIPLIER_BANDS[-1]:.0%} (noise allowance)"
                bands.setdefault(name, []).append(bool(certificate[str(layer)]["counted"]))
    if not bands:
        return []
    order = [f"<= {b:.0%}" for b in MULTIPLIER_BANDS] + [f"> {MULTIPLIER_BANDS[-1]:.0%} (noise allowance)"]
    rows = [[name, len(bands[name]), sum(bands[name])] for name in order if name in bands]
    return ["## The multiplier's tolerance, measured", "",
            "The criterion calls a layer settled when, among other things, its multiplier's window means moved by at "
            "most 50 % of max(lambda, 2). Is that loose enough to call a moving probe settled? Each converged, "
            "certified probe by how far its multiplier moved between its last two windows, and how many the "
            "certificate counts (further training left it within the tolerances fixed in advance):", "",
            table(["multiplier's last move", "converged probes", "certificate counts"], rows), ""]
