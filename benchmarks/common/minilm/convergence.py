"""The MiniLM suites' convergence table: per fit and layer, where DiffMask's fit
stood when it stopped."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

from captum_diffmask.diffmask.constrained.convergence import Convergence, least_tol_lambda, SETTLED, Window
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


#: The bands of the least multiplier tolerance a first verdict needed (a share
#: of the multiplier's scale) the tolerance section counts probes in, those
#: below the fits' own tolerance (the last band).
MULTIPLIER_BANDS = (0.05, 0.1, 0.2, 0.5)


def first_verdict_tolerances(saved: Mapping[str, Any], criterion: Convergence) -> Optional[Dict[str, Optional[float]]]:
    r"""
    Per layer of a fit that reached its cool-down, the least ``tol_lambda`` its
    first verdict needed (:func:`least_tol_lambda` over the windows before the
    cool-down's: the ones the layer first settled on, and was frozen or ended
    the fit on; for a layer still unsettled where the cool-down began at the
    criterion's budget, the tolerance that would have settled it there).
    After the cool-down the verdicts are judged again on windows at a tenth of
    the rates, where the multiplier hardly moves.

    Args:

        saved (Mapping): a fit's state file as ``torch.load`` reads it (every
                    layer trained on every batch).
        criterion (Convergence): the fit's convergence criterion.

    Returns:
        *dict* layer -> float (None with too few windows), or None when the fit
        did not reach its cool-down.
    """
    state = saved["state"]
    if state.get("cooling_from") is None:
        return None
    cooled = (int(state["step"]) - int(state["cooling_from"])) // criterion.window
    moves = {}
    for layer, monitor in saved["monitors"].items():
        windows = [Window(**w) for w in monitor["windows"]]
        moves[str(layer)] = least_tol_lambda(windows[:len(windows) - cooled], criterion)
    return moves


def multiplier_tolerance_section(dm: Mapping[str, Any]) -> List[str]:
    r"""Is the criterion's tolerance on the multiplier (the fits' own
    ``tol_lambda``) too loose? Every certified probe of a fit that reached its
    cool-down, by the least tolerance its first verdict needed
    (``tol_lambda_needed``, :func:`first_verdict_tolerances`), and how many of
    each band the certificate counts: a loose tolerance shows as probes in the
    upper bands that further training moves. Empty without them."""
    tolerance = _tol_lambda(dm)
    edges = [b for b in MULTIPLIER_BANDS if b < tolerance - 1e-12] + [tolerance]
    bands: Dict[str, List[bool]] = {}
    for mode in ("input", "hidden"):
        for run in dm[mode]["runs"]:
            certificate = (run.get("certificate") or {}).get("layers", {})
            for layer, needed in (run.get("tol_lambda_needed") or {}).items():
                if needed is None or str(layer) not in certificate:
                    continue
                band = next((b for b in edges if needed <= b + 1e-12), None)
                # above the tolerance: a layer the budget's cool-down began on unsettled
                name = f"> {tolerance:.0%}" if band is None else f"<= {band:.0%}"
                bands.setdefault(name, []).append(bool(certificate[str(layer)]["counted"]))
    if not bands:
        return []
    names = [f"<= {b:.0%}" for b in edges] + [f"> {tolerance:.0%}"]
    rows = [[name, len(bands[name]), sum(bands[name])] for name in names if name in bands]
    return ["## The multiplier's tolerance, measured", "",
            "The criterion calls a layer settled when, among other things, its multiplier's window means moved by at "
            f"most {tolerance:.0%} of max(lambda, 2) beyond two standard errors of the batches' noise. Is that "
            "loose enough to call a moving probe settled? Each certified probe of a fit that reached its "
            "cool-down, by the least tolerance its first verdict needed (on the windows it first settled on, "
            "before the cool-down; above the tolerance: a layer still unsettled where the budget began the "
            "cool-down), and how many the certificate counts (the verdict after the cool-down settled, and "
            "further training left it within the tolerances fixed in advance). Probes in the lower bands that the "
            "certificate does not count moved for another reason than a loose multiplier tolerance; a tighter "
            "tolerance would have held back every probe above it, counted or not:", "",
            table(["least tolerance the first verdict needed", "probes", "certificate counts"], rows), ""]


#: The constraint's place at the verdict, as a share of eps: the bands' upper edges.
BINDING_BANDS = (0.8, 0.9, 1.0, 1.1)


def constraint_binding_section(dm: Mapping[str, Any]) -> List[str]:
    r"""Does a probe the certificate moves end its fit off the constraint? Every
    certified probe, by where its constraint stood when the fit ended (the mean
    over the windows its record keeps, as a share of eps), with the mean change
    of its masked share under the certificate and how many the certificate
    counts; a probe whose multiplier ended at most ``lambda_floor`` (its
    constraint need not bind) in a row of its own. Empty without certificates."""
    floor = Convergence().lambda_floor
    bands: Dict[str, List[Tuple[bool, float]]] = {}
    for mode in ("input", "hidden"):
        for run in dm[mode]["runs"]:
            certificate = (run.get("certificate") or {}).get("layers", {})
            eps = (run.get("options") or {}).get("eps")
            for layer, report in (run.get("convergence") or {}).items():
                windows, cert = report.get("windows") or [], certificate.get(str(layer))
                if not windows or cert is None or not eps:
                    continue
                share = sum(w["kl"] * w["steps"] for w in windows) / sum(w["steps"] for w in windows) / eps
                name = f"multiplier <= {floor:g}" if windows[-1]["lam"] <= floor else _binding_band(share)
                moved = cert["masked_after"] - cert["masked_before"]
                bands.setdefault(name, []).append((bool(cert["counted"]), moved))
    if not bands:
        return []
    names = _binding_band_names() + [f"multiplier <= {floor:g}"]
    rows = [[name, len(bands[name]), f"{sum(m for _, m in bands[name]) / len(bands[name]):+.4f}",
             sum(c for c, _ in bands[name])] for name in names if name in bands]
    return ["## Where the constraint stood when the fit ended", "",
            "A fit ends a layer at a verdict; at an optimum of the Lagrangian a positive multiplier goes with a "
            "constraint that binds (the KL at eps). Each certified probe by its constraint's mean over the last "
            "windows its record keeps, as a share of eps (the multiplier above its floor of "
            f"{floor:g}; at or below it the constraint need not bind), the mean change of its held-out masked share "
            "under the certificate's further steps, and how many the certificate counts:", "",
            table(["constraint / eps when the fit ended", "probes", "masked share change (mean)",
                   "certificate counts"], rows), ""]


def _binding_band_names() -> List[str]:
    r"""The names of the :data:`BINDING_BANDS` bands, lowest first, and of the band above them."""
    lowers = (None,) + BINDING_BANDS[:-1]
    return ([f"< {edge:g}" if lower is None else f"{lower:g} to {edge:g}" for lower, edge in zip(lowers, BINDING_BANDS)]
            + [f">= {BINDING_BANDS[-1]:g}"])


def _binding_band(share: float) -> str:
    r"""The name of the :data:`BINDING_BANDS` band a constraint / eps share falls in."""
    return _binding_band_names()[sum(share >= edge for edge in BINDING_BANDS)]


def _tol_lambda(dm: Mapping[str, Any]) -> float:
    r"""The multiplier tolerance of the fits' criterion (a run's
    ``options["convergence"]``; the criterion's default without one)."""
    for mode in ("input", "hidden"):
        for run in dm[mode]["runs"]:
            return Convergence(**((run.get("options") or {}).get("convergence") or {})).tol_lambda
    return Convergence().tol_lambda
