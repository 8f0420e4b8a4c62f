"""The faithfulness suite's prose: the markdown report, a table per metric, the
figure, the std across seeds, speed and where DiffMask stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping

from benchmarks.common.minilm.fitting import HELD_OUT_MARGIN
from benchmarks.report import chosen_on_section, fmt, fmt_ratio, fmt_seconds, notes_section, table
from benchmarks.suites.faithfulness.rationales import VARIANTS
from benchmarks.suites.sst import counted_layers


def write_report(results: Mapping[str, Any], path: Any, json_name: str = "results.json") -> str:
    r"""Writes the suite's report (markdown) to ``path`` and returns its text."""
    model = results["model"]
    lines = [f"# {results['title']}", "",
             f"Suite `faithfulness`, **{results.get('mode', '?')}** run on `{results['split']}` "
             f"({model['evaluated_sentences']} sentences), seeds {results['seeds']}, "
             f"{_minutes(results.get('wall_seconds'))} in all{_cached_time(results)}. "
             f"Command: `{results.get('command', '')}`.", "",
             f"The sst suite's fine-tuned {model['source']} (dev macro-F1 {model['dev_macro_f1']:.2f}). Every method "
             "scores the input tokens (`layer=0`; DiffMask in input mode at each depth k, reading layers 0..k, and "
             "the mean over depths). Only the words' tokens are removed ([CLS] and [SEP] stay), the top-k as a share "
             "of them (at least one). Removal `baseline`: the token's input embedding replaced by [MASK]'s; "
             "`attention`: the token deleted from the attention mask.", ""]
    for removal in results["removals"]:
        lines += _eraser_section(results, removal)
    lines += _plausibility_section(results)
    lines += [f"![comprehensiveness and sufficiency against k]({results['figures']['curves']})", ""]
    lines += _diffmask_section(results)
    lines += _own_baseline_section(results)
    lines += _speed_section(results)
    lines += _export_section(results["export"])
    notes = list(results.get("notes") or []) + [f"{n} failed: {e}" for n, e in results.get("failures", {}).items()]
    lines += notes_section(notes)
    lines += chosen_on_section(results)
    lines += [f"All numbers are in `{json_name}`; configuration and environment there too.", ""]
    text = "\n".join(lines)
    Path(path).write_text(text, encoding="utf-8")
    return text


def _minutes(seconds: Any) -> str:
    return f"{float(seconds) / 60:.1f} min" if seconds is not None else "n/a"


def _cached_time(results: Mapping[str, Any]) -> str:
    r"""The run's time without fine-tuning (the target is stated with the model cached)."""
    model = results["model"]
    if model.get("cached") or not model.get("fine_tune_seconds"):
        return " (the fine-tuned model from the cache; target <= 60 min)"
    rest = float(results.get("wall_seconds") or 0) - float(model["fine_tune_seconds"])
    return (f", of which fine-tuning {_minutes(model['fine_tune_seconds'])}; without it {_minutes(rest)} "
            "(target <= 60 min with the model cached)")


def _with_std(record: Mapping[str, Any], key: str) -> str:
    value = fmt(record[key], 3)
    return f"{value} +- {fmt(record[key + '_std'], 3)}" if record.get("seeds", 1) > 1 else value


def _eraser_section(results: Mapping[str, Any], removal: str) -> List[str]:
    metrics, fractions = results["metrics"][removal], results["fractions"]
    every = removal == results["all_seeds_removal"]
    headers = ["method"] + [f"comp. {100 * f:g} %" for f in fractions] + ["AOPC comp. (higher better)"] + \
              [f"suff. {100 * f:g} %" for f in fractions] + ["AOPC suff. (lower better)"]
    rows = [[name] + [fmt(v, 3) for v in r["comprehensiveness"]] + [_with_std(r, "aopc_comprehensiveness")]
            + [fmt(v, 3) for v in r["sufficiency"]] + [_with_std(r, "aopc_sufficiency")] for name, r in metrics.items()]
    scope = ("mean over seeds +- std across seeds for the methods run per seed" if every
             else "the first seed's scores")
    return [f"## ERASER's metrics, tokens removed by `{removal}`", "",
            f"Drop in the probability of the predicted class when the top-k words are removed (comprehensiveness) "
            f"or are all that is kept (sufficiency), mean over sentences; {scope}.", "",
            table(headers, rows), ""]


def _plausibility_section(results: Mapping[str, Any]) -> List[str]:
    metrics = results["metrics"][results["all_seeds_removal"]]
    headers = ["method"] + [f"{m} ({v})" for v in VARIANTS for m in ("AUPRC", "token F1")]
    rows = [[name] + [_with_std(r, f"{m}/{v}") for v in VARIANTS for m in ("auprc", "token_f1")]
            for name, r in metrics.items()]
    return ["## Plausibility against SST's word labels", "",
            "Rationale: the words whose own SST label is not neutral (`non-neutral`), or very negative / very "
            "positive only (`strong`). AUPRC of each method's ranking of the words (sentences with an empty "
            "rationale left out) and the F1 of its top-k words, k the rationale's size.", "",
            table(headers, rows), ""]


def _diffmask_section(results: Mapping[str, Any]) -> List[str]:
    metrics = results["metrics"][results["all_seeds_removal"]]
    names = [n for n in metrics if n != "DiffMask mean" and not n.startswith("DiffMask layer ")]
    lines = ["## Where DiffMask stands", ""]
    for key, better in (("aopc_comprehensiveness", max), ("aopc_sufficiency", min)):
        order = sorted(metrics, key=lambda n: metrics[n][key], reverse=better is max)
        best = order[0]
        rank = order.index("DiffMask mean") + 1 if "DiffMask mean" in order else None
        lines.append(f"- {key.replace('_', ' ')}: best {best} ({fmt(metrics[best][key], 3)}); DiffMask mean over "
                     f"depths {fmt(metrics.get('DiffMask mean', {}).get(key), 3)}, rank {rank} of {len(order)} "
                     f"score sets ({len(names)} other methods).")
    if "DiffMask mean" in metrics:
        lines.append(_sufficiency_verdict(metrics, names))
        lines.append(_plausibility_verdict(metrics))
    fits = results.get("diffmask_fits") or []
    statuses = [s for fit in fits for s in fit["convergence"].values()]
    if statuses:
        counts = {s: statuses.count(s) for s in sorted(set(statuses))}
        lines.append(f"- DiffMask's fits (as the sst suite's): per-layer status at the end {counts}.")
    return lines + [""] + _verdicts_table(fits)


def _verdicts_table(fits: List[Mapping[str, Any]]) -> List[str]:
    r"""Per depth, each seed's verdict (``DiffMask layer k`` averages those
    probes), counted as the sst suite counts a probe
    (:func:`~benchmarks.suites.sst.counted_layers`): settled, within
    eps x 1.25 on held-out train sentences, and counted by the convergence
    certificate where the fit has one."""
    if not fits or not all(fit.get("convergence") for fit in fits):
        return []
    counted = [counted_layers({"convergence": {k: {"status": s} for k, s in fit["convergence"].items()},
                               "options": {"eps": fit.get("eps")}, "heldout": fit.get("heldout"),
                               "certificate": fit.get("certificate")}) for fit in fits]
    rows = []
    for layer in sorted(fits[0]["convergence"], key=int):
        cells = []
        for fit, states in zip(fits, counted):
            state = states[int(layer)]
            kl = ((fit.get("heldout") or {}).get(layer) or {}).get("kl")
            certified = {None: "", True: ", certified", False: ", not certified"}[state["certified"]]
            cells.append(f"seed {fit['seed']}: {fit['convergence'][layer]}" + certified
                         + ("" if kl is None else f", held-out KL {fmt(kl, 4)}" + ("" if state["within"] else " (over)")))
        total = sum(states[int(layer)]["counts"] for states in counted)
        rows.append([f"DiffMask layer {layer}", "; ".join(cells), f"{total} of {len(fits)}"])
    return ["Each depth's probes (its score set averages them over the seeds); a probe counts when its fit "
            f"settled (`converged` or `needed`), its read-out's KL on held-out train sentences is within eps x "
            f"{HELD_OUT_MARGIN:g}, and its convergence certificate (further steps from the fit's state, drift "
            "within tolerances stated in advance; the sst suite's) counts it:", "",
            table(["score set", "verdicts", "probes that count"], rows), ""]


def _own_baseline_section(results: Mapping[str, Any]) -> List[str]:
    r"""DiffMask's depths with [MASK] and with their own learned baseline as the
    removal, side by side (absent from runs made without it)."""
    own = results["metrics"].get("own baseline")
    if not own:
        return []
    mask = results["metrics"].get("baseline", {})
    rows = [[name, _with_std(mask[name], "aopc_comprehensiveness") if name in mask else "n/a",
             _with_std(record, "aopc_comprehensiveness"),
             _with_std(mask[name], "aopc_sufficiency") if name in mask else "n/a",
             _with_std(record, "aopc_sufficiency")] for name, record in own.items()]
    best = min(own, key=lambda n: own[n]["aopc_sufficiency"])
    return ["## DiffMask with its own baseline as the removal", "",
            "DiffMask's gates replace the tokens they close by the depth's learned baseline, not by [MASK]'s "
            "embedding: the same scores, the removed tokens' input embeddings replaced by that fit's baseline of "
            "the depth (every seed). Lower sufficiency with its own baseline than with [MASK]'s says the masks "
            "are sufficient under the replacement they were trained with.", "",
            table(["score set", "AOPC comp., [MASK]", "AOPC comp., own baseline", "AOPC suff., [MASK]",
                   "AOPC suff., own baseline"], rows), "",
            f"- Lowest AOPC sufficiency with its own baseline: {best} ({fmt(own[best]['aopc_sufficiency'], 3)}).", ""]


def _sufficiency_verdict(metrics: Mapping[str, Any], names: List[str]) -> str:
    r"""Whether DiffMask's training for sufficiency shows: which methods its depths
    beat on AOPC sufficiency (lower is better)."""
    depths = [n for n in metrics if n.startswith("DiffMask")]
    best = min(depths, key=lambda n: metrics[n]["aopc_sufficiency"])
    value = metrics[best]["aopc_sufficiency"]
    beaten = [n for n in names if metrics[n]["aopc_sufficiency"] > value]
    ahead = [n for n in names if metrics[n]["aopc_sufficiency"] <= value]
    shows = "it shows" if not ahead else "it does not show"
    return (f"- DiffMask is trained for sufficiency (its gates keep the output when only the kept tokens remain). "
            f"Here {shows}: its best score set ({best}, AOPC sufficiency {fmt(value, 3)}) beats "
            f"{', '.join(beaten) or 'no other method'} and is behind {', '.join(ahead) or 'none'}.")


def _plausibility_verdict(metrics: Mapping[str, Any]) -> str:
    key = "auprc/non-neutral"
    best = max(metrics, key=lambda n: metrics[n][key])
    return (f"- Plausibility (AUPRC against the non-neutral words): best {best} ({fmt(metrics[best][key], 3)}); "
            f"DiffMask mean over depths {fmt(metrics['DiffMask mean'][key], 3)}.")


def _speed_section(results: Mapping[str, Any]) -> List[str]:
    seconds = results["seconds_per_sentence"]
    forward = seconds["forward"]
    rows = [[name, fmt_seconds(value), fmt_ratio(value / forward if forward else None)] for name, value in seconds.items()]
    return ["## Speed", "", "Attribution per sentence in batches of 32 (DiffMask: one pass for every depth; its fit "
            "and the bottleneck's statistics not included), and as a ratio to one forward pass.", "",
            table(["", "seconds per sentence", "x forward"], rows), ""]


def _export_section(export: Mapping[str, Any]) -> List[str]:
    return ["## Export", "",
            f"`{export['folder']}/annotations.jsonl` (the `non-neutral` rationales in ERASER's annotation format) and "
            f"one file per method in ERASER's prediction format, {export['lines']} sentences each: "
            + ", ".join(f"`{f}`" for f in export["files"].values()) + ". Fields: `docs/guide/evaluating.md`. The "
            "files hold SST's sentences, so a run writes them beside its report and the repository does not keep "
            "them.", ""]


def headline(results: Mapping[str, Any]) -> str:
    r"""One line of a run's numbers for the results' index: the method with the
    highest AOPC comprehensiveness, DiffMask's best layer and the chance
    reference, under the first baseline."""
    metrics = results.get("metrics") or {}
    if not metrics:
        return ""
    variant, rows = next(iter(metrics.items()))
    scored = {name: row["aopc_comprehensiveness"] for name, row in rows.items() if "aopc_comprehensiveness" in row}
    if not scored:
        return ""
    best = max(scored, key=scored.get)
    diffmask = max((n for n in scored if n.startswith("DiffMask")), key=scored.get, default=None)
    parts = [f"AOPC comprehensiveness ({variant}): {best} {scored[best]:.3f}"]
    if diffmask is not None and diffmask != best:
        parts.append(f"{diffmask} {scored[diffmask]:.3f}")
    if "Random" in scored:
        parts.append(f"Random {scored['Random']:.3f}")
    return ", ".join(parts)
