"""The components suite's run: the tracr programs, then the SST MiniLM, then the figures."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, Dict, List, Mapping

from captum_diffmask.convergence import SETTLED

from ...progress import log_to_stderr
from .figures import sst_figure, tracr_figures
from .sst_heads import run_sst
from .tracr import score_program

#: The issue's target for amortised DiffMask's mean ROC AUC on every program.
TARGET_AUC = 0.95
#: The verdicts under which a fit's AUC counts toward the target: settled
#: (:data:`~captum_diffmask.convergence.SETTLED`), or every gate of the block
#: closed with the constraint kept (the right answer for a block whose
#: components the program does not use). A violated, collapsed, unsettled or
#: open block leaves the mask's scores without a verdict.
COUNTED_VERDICTS = SETTLED + ("closed",)


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""
    Runs both parts for the first seed of ``config["seeds"]``.

    Args:

        config (Mapping): :data:`DEFAULTS` with the run's changes.
        out_dir (Path): where ``figures/`` goes.
        verbose (bool, optional): a line per program and fit. Default: True

    Returns:
        *dict*: ``tracr`` (lines, skipped), ``sst`` (or the reason it was
        skipped), ``figures``, ``checks``.
    """
    seed = int(config["seeds"][0])
    results: Dict[str, Any] = {"title": "Component masks: tracr's ground truth and the SST MiniLM's heads"}
    figures: List[Dict[str, str]] = []
    tracr = config.get("tracr")
    if tracr and tracr.get("programs"):
        results["tracr"] = _run_tracr(tracr, seed, out_dir, figures, verbose)
    sst = config.get("sst")
    if sst:
        try:
            results["sst"] = run_sst(sst, seed, verbose)
        except (FileNotFoundError, ImportError) as error:  # SSTDataError is a FileNotFoundError
            results["sst"] = {"skipped": f"{type(error).__name__}: {error}"}
            log_to_stderr(verbose, f"[components] sst skipped: {error}")
        if "figure" in results["sst"] and results["sst"]["figure"]["tokens"]:
            name = sst_figure(results["sst"].pop("figure"), out_dir / "figures")
            figures.append({"file": f"figures/{name}", "caption": "SST dev sentences: P(kept) of every head "
                            "(columns) of every block (rows), amortised DiffMask (per sentence) and the per-task "
                            "mask (the same for every sentence)."})
    results["figures"] = figures
    results["checks"] = checks(results)
    return results


def _run_tracr(config: Mapping[str, Any], seed: int, out_dir: Path, figures: List[Dict[str, str]],
               verbose: bool) -> Dict[str, Any]:
    lines, shown = [], []
    for name in config["programs"]:
        try:
            new, figure = score_program(name, seed, config)
        except ImportError as error:
            log_to_stderr(verbose, f"[components] tracr skipped: {error}")
            return {"lines": lines, "skipped": f"ImportError: {error}"}
        except Exception as error:  # one program's failure is recorded, the others run
            lines.append({"program": name, "error": f"{type(error).__name__}: {error}",
                          "traceback": traceback.format_exc()})
            continue
        lines += new
        shown.append(figure)
        log_to_stderr(verbose, f"[components] {name}: " + ", ".join(
            f"{line['kind']} {line['method']} AUC {line['auc']:.3f}" for line in new))
    for file in tracr_figures(shown, out_dir / "figures") if config.get("figure_inputs") else []:
        figures.append({"file": f"figures/{file}", "caption": f"`{file[11:-4]}`: per held-out input (columns), "
                        "blocks x components as each method scores them; the first column: the components the "
                        "program uses."})
    return {"lines": lines}


def checks(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""The issue's target: amortised DiffMask's mean ROC AUC >= 0.95 on every
    program and kind, with fit's defaults and with each variant's options, met
    only where every block's verdict is one of :data:`COUNTED_VERDICTS`."""
    rows = [line for line in results.get("tracr", {}).get("lines", [])
            if str(line.get("method", "")).startswith("DiffMask")]
    out = []
    for line in rows:
        uncounted = sorted({str(v) for v in line.get("verdicts", {}).values()} - set(COUNTED_VERDICTS))
        value = f"{line['auc']:.3f}" + (f" (not counted: {', '.join(uncounted)})" if uncounted else "")
        out.append({"target": f"amortised {line['method']}: ROC AUC >= {TARGET_AUC} ({line['program']}, {line['kind']})",
                    "value": value, "met": bool(line["auc"] >= TARGET_AUC and not uncounted)})
    return out
