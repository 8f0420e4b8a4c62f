"""The components suite's report: the generic writer with the suite's own tables."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from benchmarks.report import fmt, table, write_report as write_generic
from benchmarks.suites.components.orchestration import checks, diffmask_fits, uncounted_verdicts
from benchmarks.suites.components.tracr import LOGIT_SCALE, PER_TASK_LR
from benchmarks.tasks.tracr_models import PROGRAMS
from captum_diffmask.diffmask.constrained.convergence import SETTLED


def tracr_table(lines: Sequence[Mapping[str, Any]]) -> str:
    r"""A row per program, kind and method."""
    rows = []
    for line in lines:
        if "error" in line:
            rows.append([line["program"], "-", "-", "failed: " + line["error"]] + ["-"] * 8)
            continue
        verdicts = ", ".join(f"{k}: {v}" for k, v in line.get("verdicts", {}).items()) or "-"
        rows.append([
            line["program"], line["kind"], f"{line['used']} / {line['components']}", line["method"],
            f"{fmt(line['auc'])} ({fmt(line['auc_min'])})", fmt(line.get("auc_active")), verdicts,
            fmt(line.get("kept_kl")), fmt(line.get("kept_share"), 2), fmt(line.get("fit_seconds"), 0),
            fmt(1e6 * line["attribute_seconds"], 0),
            fmt(line["per_task_refit_seconds"], 0) if line["method"] == "per-task mask" else "-",
        ])
    headers = ["program", "component", "used / all", "method", "ROC AUC, used (mean, min)", "ROC AUC, active",
               "verdicts", "KL kept", "kept share", "fit (s)", "attribution per input (µs)",
               "refitted on one input (s)"]
    return table(headers, rows)


def seeds_table(lines: Sequence[Mapping[str, Any]]) -> List[str]:
    r"""Per program, kind and amortised DiffMask fitted at several seeds: the
    ROC AUC at each, their mean and lowest, and how many fits count (every
    block's verdict one of :data:`~.orchestration.COUNTED_VERDICTS`)."""
    rows = []
    for (program, kind, method), fits in diffmask_fits(list(lines)).items():
        if len(fits) < 2:
            continue
        aucs = [fit["auc"] for fit in fits]
        counted = sum(not uncounted_verdicts(fit) for fit in fits)
        rows.append([program, kind, method, " / ".join(f"{fit['seed']}: {fmt(fit['auc'])}" for fit in fits),
                     fmt(sum(aucs) / len(aucs)), fmt(min(aucs)),
                     fmt(sum(fit["auc_active"] for fit in fits) / len(fits)), f"{counted} of {len(fits)}",
                     fmt(sum(fit["fit_seconds"] for fit in fits) / len(fits), 0)])
    if not rows:
        return []
    return [
        "### Amortised DiffMask across seeds",
        "",
        "The variants fitted at every seed of the run (a seed draws the training and held-out inputs and "
        "the fit's randomness): the ROC AUC against the used components at each seed, the mean (the "
        "targets' figure) and the lowest, the mean ROC AUC against the active ones, and the fits whose "
        "every block ended converged, needed or closed (the others' scores count toward no target). The "
        "table above gives the first seed's fits.",
        "",
        table(["program", "component", "method", "ROC AUC, used, per seed", "mean", "lowest",
               "ROC AUC, active (mean)", "fits counted", "fit (s, mean)"], rows),
        "",
    ]


def tracr_section(tracr: Mapping[str, Any]) -> List[str]:
    # the first seed's lines (every method); the further seeds' go to the seeds table
    first = _first_seed(tracr)
    lines = [line for line in tracr.get("lines", []) if "auc" not in line or line.get("seed") == first]
    programs = sorted({line["program"] for line in lines})
    out = ["## tracr: against the components the program uses", ""]
    if tracr.get("skipped"):
        out += [f"Skipped: {tracr['skipped']} (the `components` extra: `pip install -e \".[components]\"`).", ""]
    if not lines:
        return out
    out += [
        "Programs compiled by tracr (" + ", ".join(f"`{p}`: {PROGRAMS[p][0]}" for p in programs) + ") and "
        "converted to PyTorch (`benchmarks/tasks/tracr_models.py`). A component is *used* when tracr gave it "
        "non-zero weights, *active* on an input when it is used and its output (a head's, before the output "
        "projection) or activation (a unit's) is non-zero at a real position. Per held-out input, the ROC AUC "
        "of a method's scores over every component of every block against the used ones (the issue's "
        "measure; the mean and the minimum over the inputs) and against the active ones (the most a "
        "per-input mask can be asked for: a used unit that is silent on an input changes nothing when "
        "closed). Closed components are replaced by zeros (fixed). The read-out is tracr's one-hot output "
        f"space times {LOGIT_SCALE:g} as logits (output `all`: every real position's distribution).",
        "",
        "- **DiffMask**: `DiffMask(mode=kind, l0=\"expected\")`, amortised (a probe reads each input), fit's "
        "defaults; the paper's sum L0, the constructor's default when the report was made.",
        f"- **per-task mask**: `per_task=True` (one mask for every input, Subnetwork Probing), lr {PER_TASK_LR:g}; "
        "its last column: the same mask refitted on one input alone, the cost of a per-input mask without "
        "amortisation.",
        "- **attribution patching**: `AttributionPatching(kind=...)`, zero baseline, the predicted tokens' "
        "log-probability; no mask (no verdict, no KL).",
        "",
        "Verdicts are per block (layer k = block k). *KL kept*: the model with every block's deterministic "
        "gates at once (each block was fitted with the others intact), mean over inputs; *kept share*: the "
        "share of components with P(kept) > 0.5.",
        "",
        tracr_table(lines),
        "",
        *seeds_table(tracr.get("lines", [])),
        *idle_section(lines),
    ]
    return out


def _first_seed(tracr: Mapping[str, Any]) -> Any:
    r"""The seed every method was run at (the first line's)."""
    return next((line["seed"] for line in tracr.get("lines", []) if "seed" in line), None)


def idle_section(lines: Sequence[Mapping[str, Any]]) -> List[str]:
    r"""The used components idle on an input against the unused ones, per line."""
    rows = [[line["program"], line["kind"], line["method"], fmt(line["auc_idle_unused"]), fmt(line["median_active"]),
             fmt(line["median_idle"]), fmt(line["median_unused"])]
            for line in lines if "auc_idle_unused" in line]
    if not rows:
        return []
    return [
        "### Idle used components against unused ones",
        "",
        "On one input, a used component that is idle there (not active) and an unused one have the same "
        "effect when closed: none. A per-input mask is then given no reason to rank the first above the "
        "second, and the ROC AUC against the used components counts every such pair. The first column: per "
        "input, the ROC AUC of the idle used components' scores against the unused ones' (0.5: no better "
        "than chance; what a method reaches there comes from what it shares across inputs); then the median "
        "score of the active, the idle and the unused components over every input.",
        "",
        table(["program", "component", "method", "ROC AUC, idle vs unused", "median score, active",
               "median score, idle", "median score, unused"], rows),
        "",
    ]


def sst_section(sst: Mapping[str, Any], config: Optional[Mapping[str, Any]] = None) -> List[str]:
    r"""The SST part: heads kept per block and method, the verdicts, the cost
    (``config``: the suite's ``sst`` settings the part ran with)."""
    out = ["## SST MiniLM: heads per layer at unchanged prediction", ""]
    if sst.get("skipped"):
        return out + [f"Skipped: {sst['skipped']}.", ""]
    config = config or {}
    model = sst.get("model", {})
    joint = any(result.get("joint") for result in sst["methods"].values())
    how = ("one mask over every block's heads at once, one constraint on the output with all of them gated"
           if joint else "each block's mask fitted with the others intact")
    out += [
        f"The sst suite's fine-tuned MiniLM ({model.get('layers', '?')} blocks of 12 heads, dev accuracy "
        f"{fmt(model.get('dev_accuracy'), 1)} %). Both masks fitted on {sst['train_sentences']} train sentences: "
        f"{how}; fit's defaults changed by `{dict(config.get('fit') or {})}` (the per-task mask's lr "
        f"{PER_TASK_LR}), at most {config.get('max_steps', '-')} steps, the model's passes in "
        f"{config.get('precision', 'float32')} and eps {fmt(sst['eps'], 3)} (the sst suite's); closed heads "
        f"replaced by learned baselines started at the mean head output; scored on {sst['eval_sentences']} dev "
        "sentences. Per block: the heads kept (P > 0.5) per sentence, mean ± std over sentences"
        + ("" if joint else "; the share of sentences whose prediction the block's kept heads keep; the mean KL; "
           "the fit's verdict")
        + ". *All at once*: the model with every block's kept heads"
        + (", and the joint fit's verdict" if joint else "")
        + ". A conclusion rests on fits whose verdict is `converged` or `needed`.",
        "",
    ]
    rows = []
    for name, result in sst["methods"].items():
        for block, row in result["blocks"].items():
            rows.append([name, block, f"{fmt(row['heads_kept'], 2)} ± {fmt(row['heads_kept_std'], 2)}",
                         f"{fmt(100 * row['agreement'], 1)} %" if "agreement" in row else "-",
                         fmt(row["kl"]) if "kl" in row else "-", row.get("verdict", "-")])
        total = sum(row["heads_kept"] for row in result["blocks"].values())
        rows.append([name, "all at once", f"{fmt(total, 2)} in all", f"{fmt(100 * result['every_block_agreement'], 1)} %",
                     fmt(result["every_block_kl"]), result.get("every_block_verdict", "-")])
    out += [table(["method", "block", "heads kept", "prediction kept", "KL", "verdict"], rows), ""]
    verdicts = [str(v) for result in sst["methods"].values() for v in result["verdicts"].values()]
    settled = sum(v in SETTLED for v in verdicts)
    caveat = ("." if settled == len(verdicts) else
              "; the others' counts describe the fits as they ended and support no conclusion about the heads "
              "the model needs.")
    counted = "Fits settled" if joint else "Blocks whose fit settled"
    out += [f"{counted} ({', '.join(SETTLED)}): {settled} of {len(verdicts)}{caveat}", ""]
    cost = [[name, r.get("steps", "-"), _multipliers(r), fmt(r["fit_seconds"], 0), fmt(1e3 * r["attribute_seconds"], 2),
             fmt(r.get("refit_seconds"), 0) if "refit_seconds" in r else "-"] for name, r in sst["methods"].items()]
    ceiling = dict(config.get("fit") or {}).get("lambda_max", 200.0)
    out += [f"Cost, and where each fit ended (steps per fitted layer; the multiplier, its ceiling {fmt(ceiling, 0)}):",
            "", table(["method", "steps", "multiplier", "fit (s)", "attribution per sentence (ms)",
                       "refitted on one sentence (s)"], cost), ""]
    return out


def _multipliers(result: Mapping[str, Any]) -> str:
    r"""A fit's multipliers as it ended, by layer ("-" for records without them)."""
    values = result.get("multipliers") or {}
    if len(values) == 1:
        return fmt(next(iter(values.values())), 1)
    return ", ".join(f"{k}: {fmt(v, 1)}" for k, v in values.items()) or "-"


def sections(results: Mapping[str, Any]) -> List[str]:
    r"""The suite's own markdown: the tracr table and the SST table."""
    lines: List[str] = []
    if "tracr" in results:
        lines += tracr_section(results["tracr"])
    if "sst" in results:
        lines += sst_section(results["sst"], results.get("config", {}).get("sst"))
    return lines


def write_report(results: Mapping[str, Any], path: Union[str, "os.PathLike[str]"], json_name: str = "results.json") -> str:
    r"""The generic report (run line, targets, figures, configuration) with :func:`sections`."""
    with_sections: Dict[str, Any] = {**results, "extra_sections": sections(results), "checks": checks(results)}
    return write_generic(with_sections, path, json_name)
