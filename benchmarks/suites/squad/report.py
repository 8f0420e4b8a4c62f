"""The squad suite's prose: the markdown report, one function per section, every
number read from the results."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, List, Mapping, Optional

from benchmarks.report import (
    chosen_on_section, configuration_section, environment_section, fmt, fmt_ratio, fmt_seconds, notes_section, table,
)
from benchmarks.common.minilm.convergence import convergence_section, probe_counts
from benchmarks.common.minilm.fit_cache import fitted_where
from benchmarks.common.minilm.fitting import HELD_OUT_MARGIN
from benchmarks.suites.squad.analysis import GROUPS
from benchmarks.suites.squad.fitting import fit_batches
from benchmarks.suites.squad.observations import MIN_POS_TOKENS, OBSERVATION_MODES

MODES = ("input", "hidden")


def write_report(results: Mapping[str, Any], path: Any, json_name: str = "results.json") -> str:
    r"""Writes the suite's report (markdown) to ``path`` and returns its text."""
    env = results.get("environment", {})
    lines = [f"# {results['title']}", "",
             f"Suite `squad`, **{results.get('mode', '?')}** run, DiffMask seed {results['seeds'][0]}, "
             f"{fmt_seconds(results.get('wall_seconds'))} in all ({(results.get('wall_seconds') or 0) / 60:.1f} min), "
             f"torch threads {env.get('threads', '?')}, device {env.get('device', 'cpu')}, commit `{env.get('git_commit')}`. Command: "
             f"`{results.get('command', '')}`. " + _provenance(results), ""]
    for section in (_model_section, _observations_section, _keep_section, _agreement_section, _paper_recipe_section,
                    _gold_section, _pos_section, _heatmaps_section, _side_by_side_section, _speed_section, _training_section,
                    _time_section):
        lines += section(results)
    lines += notes_section(results.get("notes") or [])
    lines += chosen_on_section(results)
    lines += configuration_section(results.get("config", {}))
    lines += environment_section(env)
    lines += [f"All numbers are in `{json_name}`.", ""]
    text = "\n".join(lines)
    Path(path).write_text(text, encoding="utf-8")
    return text


def _model_section(results: Mapping[str, Any]) -> List[str]:
    m = results["model"]
    split, run, fit = m["split"], m["held_out_run"], m["held_out"]
    history = m.get("history") or []
    epochs = ", ".join(f"epoch {h['epoch']}: loss {h['train_loss']:.3f}, {fmt_seconds(h['seconds'])}"
                       + (f" ({fmt_seconds(h['cpu_seconds'])} CPU)" if "cpu_seconds" in h else "") for h in history)
    return ["## The model and the split", "",
            f"{m['source']} ({m['layers']} layers, {m['parameters'] / 1e6:.1f} M parameters) with a new span head, "
            f"fine-tuned on SQuAD v1.1 dev split by article (seed {split['seed']}): **{split['train_articles']} articles "
            f"({split['train_questions']} questions) for fine-tuning, {split['held_out_articles']} held out "
            f"({split['held_out_questions']} questions)**; every number of this report is on the held-out articles "
            f"({', '.join(split['held_out_titles'])}).", "",
            f"Windows: `[CLS] question [SEP] context [SEP]`, **max length {m['max_length']}, doc stride "
            f"{m['doc_stride']}** (the context cut into overlapping windows; an answer not whole inside a window is "
            f"labelled `[CLS]` there, as Hugging Face's recipe). {m['windows']} fine-tuning windows; "
            f"fine-tuning {'read from the cache' if m['cached'] else 'ran in this run'}: "
            f"**{fmt_seconds(m['fine_tune_seconds'])} ({m['fine_tune_seconds'] / 60:.1f} min)** when it ran ({epochs}).", "",
            f"**Held-out official score: EM {run['exact_match']:.2f}, F1 {run['f1']:.2f}** over {run['count']} questions "
            f"({m['held_out_windows']} windows), computed in this run (when fine-tuned: EM {fit['exact_match']:.2f}, "
            f"F1 {fit['f1']:.2f}). The analyses read {m['analysed_questions']} held-out questions spread evenly over "
            f"the held-out articles ({m['analysed_windows']} windows; the model's EM {results['questions']['exact_match']:.2f}, "
            f"F1 {results['questions']['f1']:.2f} on them).", ""]


def _observations_section(results: Mapping[str, Any]) -> List[str]:
    rows = [[o["paper"], o["ours"], f"**{o['verdict']}**", _rests_on(results, OBSERVATION_MODES[o["key"]])]
            for o in results["observations"]]
    return ["## The paper's observations on MiniLM", "",
            "Each criterion was fixed before the run (`benchmarks/suites/squad/observations.py`): question deeper = "
            "input mode, more expected layers kept for question than passage tokens; prediction kept = input mode, "
            "same answer (exact match against the unmasked answer) on > 90 % of the questions at every layer and on "
            "the questions with > 95 % masked; gold when wrong = input mode, the share of gold-answer tokens kept "
            "(averaged over the layers) on wrongly answered questions within 45-75 %; POS = CCONJ and ADP in the "
            f"lowest third, PROPN and PUNCT in the highest third of the parts of speech with >= {MIN_POS_TOKENS} tokens "
            "ranked by expected layers kept (input); [SEP] = hidden mode, >= 90 % of [SEP] states kept at every "
            "layer but the last and < 50 % at the last.", "",
            "An observation is a conclusion only where every probe of its mode counts (the last column); "
            "otherwise it reads layers whose fit did not settle, or whose read-out broke the constraint on "
            "held-out windows, and says only where those fits stood.", "",
            table(["the paper (BERT-large)", "ours (MiniLM)", "on MiniLM", "the probes it rests on"], rows), "",
            *_fit_caveat(results)]


def _counted(record: Mapping[str, Any]) -> Optional[int]:
    r"""How many of a fit's probes count (settled, and the held-out KL within
    eps x :data:`HELD_OUT_MARGIN`); None for a run that selected a checkpoint
    (no held-out scores)."""
    if not record.get("heldout"):
        return None
    eps = float(record["options"].get("eps", math.nan))
    return sum(all(probe_counts(c["status"], record["heldout"][layer]["kl"], eps))
               for layer, c in record["convergence"].items())


def _rests_on(results: Mapping[str, Any], mode: str) -> str:
    r"""The observation's probes: how many of its mode's count, and whether
    it is a conclusion."""
    record = results["diffmask"][mode]
    total, counted = len(record["convergence"]), _counted(record)
    if counted is None:
        return f"{mode}: not scored on held-out windows"
    return f"{mode}: {counted} of {total} count" + ("" if counted == total else ", **not a conclusion**")


def _fit_caveat(results: Mapping[str, Any]) -> List[str]:
    r"""How far the fits the verdicts rest on got: per mode, the layers that
    converged (the fit's own verdict), those still violating the constraint,
    and the held-out check (or, with checkpoint selection, the validation bound)."""
    parts = []
    for mode in MODES:
        record = results["diffmask"][mode]
        status = {layer: c["status"] for layer, c in record["convergence"].items()}
        violated = sum(s == "violated" for s in status.values())
        text = (f"{mode}: {sum(s == 'converged' for s in status.values())} of {len(status)} layers converged"
                + (f", {violated} still above the KL bound on the training batches" if violated else "")
                + f" after {fit_batches(record)} steps (batches)")
        counted = _counted(record)
        if counted is not None:
            text += (f"; {counted} of {len(status)} probes count (settled, and the deterministic read-out's KL on "
                     f"the held-out windows within eps x {HELD_OUT_MARGIN:g})")
        else:
            text += (f", validation {'within' if record['feasible'] else 'outside'} the bound "
                     f"(eps_valid {record['options'].get('eps_valid')})")
        parts.append(text)
    return [f"The verdicts rest on the fits below (`DiffMask training`, `Convergence per layer`): {'; '.join(parts)}.", ""]


def _keep_section(results: Mapping[str, Any]) -> List[str]:
    lines = ["## Which tokens are kept, per layer", "",
             "Mean keep probability (%) of each group's tokens at each layer over the analysed windows (input mode: "
             "the probe reads layers 0..k and the input token is kept; hidden mode: the state of layer k is kept); "
             "`layers` = the expected number of layers kept (sum of the keep probabilities over the "
             f"{results['model']['layers'] + 1} layers). The gold and predicted answers are passage tokens too.", ""]
    for mode in MODES:
        keep = results["keep"][mode]
        width = len(next(iter(keep.values()))["keep"])
        rows = [[g, keep[g]["tokens"], *[f"{v:.1f}" for v in keep[g]["keep"]], f"{keep[g]['mean_layers']:.2f}"]
                for g in GROUPS if g in keep]
        lines += [f"**{mode}**", "", table(["group", "tokens", *[str(k) for k in range(width)], "layers"], rows), ""]
    return lines + [f"![keep per layer]({results['figures']['keep']})", ""]


def _agreement_section(results: Mapping[str, Any]) -> List[str]:
    lines = ["## The model under DiffMask's gates", "",
             "Deterministic gates (kept where the keep probability exceeds 0.5), gated-off inputs or states replaced "
             "by the learned baseline, the answer read as the unmasked one (best span over the question's windows). "
             "`same EM/F1`: the official score of the masked answer against the model's own unmasked answer; "
             "`gold EM/F1`: against the gold answers; `> 95 % masked`: the questions with more than 95 % of their "
             "real positions masked, and the same-answer EM on them.", ""]
    for mode in MODES:
        rows = [[r["layer"], f"{r['masked_share']:.1f}", f"{r['same_exact_match']:.1f}", f"{r['same_f1']:.1f}",
                 f"{r['gold_exact_match']:.1f}", f"{r['gold_f1']:.1f}", r["over_95_questions"],
                 fmt(r["over_95_same_exact_match"], 1)] for r in results["agreement"][mode]]
        lines += [f"**{mode}** (unmasked on these questions: EM {results['questions']['exact_match']:.2f}, "
                  f"F1 {results['questions']['f1']:.2f})", "",
                  table(["layer", "masked %", "same EM", "same F1", "gold EM", "gold F1", "> 95 % masked", "same EM there"],
                        rows), ""]
    return lines


def _paper_recipe_section(results: Mapping[str, Any]) -> List[str]:
    r"""The paper's QA recipe beside fit's defaults, per mode and layer (absent
    from runs made without it)."""
    paper = results.get("paper_recipe")
    if not paper:
        return []
    options = paper["diffmask"]["input"]["options"]
    epochs = paper["epochs"]
    lines = ["## The paper's recipe, as a reference", "",
             "The paper's QA recipe (its appendix table; `PAPER_FIT`: Lookahead RMSprop at lr 3e-4, the multiplier "
             "at 0.1, one layer drawn per batch, batch 8, KL(start) + KL(end) <= 1, the sum L0, tied input votes; "
             "inputs 1 epoch per layer, hidden states 4 epochs) for "
             f"{epochs['input']} epochs (input) and {epochs['hidden']} (hidden), seed {paper['seed']}, on the same "
             "model and windows, no checkpoint selected, no step cap but the configuration's; scored as the suite's "
             "fits (the held-out fine-tuning windows, the analysed questions); beside it, fit's defaults above. "
             f"Options: `{options}`.", ""]
    for mode in MODES:
        record, ours = paper["diffmask"][mode], {r["layer"]: r for r in results["agreement"][mode]}
        eps = float(record["options"].get("eps", 1.0))
        rows = []
        for row in record["agreement"]:
            k = row["layer"]
            status = (record.get("convergence") or {}).get(str(k), {}).get("status", "?")
            kl = ((record.get("heldout") or {}).get(str(k)) or {}).get("kl")
            held = "" if kl is None else f"{fmt(kl, 4)} {'ok' if probe_counts(status, kl, eps)[1] else 'over'}"
            default = ours.get(k, {})
            rows.append([k, status, f"{row['masked_share']:.1f}", f"{row['same_exact_match']:.1f}", f"{row['same_f1']:.1f}",
                         held, fmt(default.get("masked_share"), 1), fmt(default.get("same_exact_match"), 1)])
        lines += [f"**{mode}** ({record.get('steps', '?')} steps, {fitted_where(record)})", "",
                  table(["layer", "verdict", "masked %", "same EM", "same F1", f"held-out KL (<= {HELD_OUT_MARGIN * eps:g})",
                         "fit's defaults: masked %", "fit's defaults: same EM"], rows), ""]
    return lines


def _gold_section(results: Mapping[str, Any]) -> List[str]:
    lines = ["## The gold answer when the model is wrong", "",
             "Share (%) of the gold answer's tokens kept (deterministic gates) per layer, in the windows that hold "
             "the gold answer whole, by the model's correctness; the passage's for reference.", ""]
    for mode in MODES:
        rows = []
        for case, entry in results["gold_when_wrong"][mode].items():
            for group in ("gold answer", "passage"):
                if group in entry:
                    shares = entry[group]["kept_share"]
                    rows.append([case, entry["questions"], group, *[f"{s:.1f}" for s in shares],
                                 f"{statistics.mean(shares):.1f}"])
        width = len(rows[0]) - 4 if rows else 0
        lines += [f"**{mode}**", "",
                  table(["case", "questions", "tokens", *[str(k) for k in range(width)], "mean"], rows), ""]
    return lines


def _pos_section(results: Mapping[str, Any]) -> List[str]:
    pos = results.get("pos") or {}
    if not pos:
        return ["## Parts of speech", "", "Not measured in this run (see the notes).", ""]
    lines = ["## Parts of speech", "",
             "Expected number of layers kept by the universal part of speech (spaCy `en_core_web_sm` 3.8 on the "
             "question and the context; a word piece takes the tag of the word under its first character), "
             f"parts of speech with >= {MIN_POS_TOKENS} tokens, ordered by the input mode over all tokens.", ""]
    names = sorted({n.split(":", 1)[1] for n in pos["input"]},
                   key=lambda g: pos["input"].get(f"all:{g}", {}).get("mean_layers", 0.0))
    rows = []
    for g in names:
        if pos["input"].get(f"all:{g}", {}).get("tokens", 0) < MIN_POS_TOKENS:
            continue
        row: List[Any] = [g, pos["input"][f"all:{g}"]["tokens"]]
        for mode in MODES:
            row += [fmt(pos[mode].get(f"{s}:{g}", {}).get("mean_layers"), 2) for s in ("question", "context", "all")]
        rows.append(row)
    headers = ["POS", "tokens", *[f"{m} {s}" for m in MODES for s in ("question", "context", "all")]]
    return lines + [table(headers, rows), "", f"![parts of speech]({results['figures']['pos']})", ""]


def _heatmaps_section(results: Mapping[str, Any]) -> List[str]:
    lines = ["## Per-example heatmaps", "",
             "DiffMask's keep probabilities (not normalised) for each token at each layer, input and hidden mode, on "
             "the examples of the side-by-side figure; shown: `[CLS]`, the question, `[SEP]` and the passage around "
             "the gold answer (marked `*`), the attributions computed on the whole window.", ""]
    return lines + [f"![heatmap]({p})" for p in results["figures"]["heatmaps"]] + [""]


def _side_by_side_section(results: Mapping[str, Any]) -> List[str]:
    sbs = results["side_by_side"]
    if not sbs["examples"]:
        return []
    lines = ["## The methods side by side", "",
             "Input attributions of the methods of the paper's comparison figure on the shortest analysed questions "
             "read in one window (one per passage; chosen by length alone): amortised DiffMask (input mode, the keep "
             "averaged over the layers, as the paper's figure), per-example DiffMask, exact erasure (the smallest "
             "kept set whose start and end argmax are unchanged, zero baseline at the word embeddings, subsets "
             "enumerated by increasing size and **capped at a budget** of evaluations per example), Integrated "
             "Gradients (zero baseline, target the predicted start and end), the per-sample bottleneck and Guan, "
             "with the authors' QA settings (the configuration below).", ""]
    lines += [table(["example", "question", "gold", "predicted", "tokens"],
                    [[i, e["question"], e["gold"], e["predicted"], e["tokens"]] for i, e in enumerate(sbs["examples"])]), ""]
    rows = []
    for name, record in sbs["methods"].items():
        if record.get("status") != "ok":
            rows.append([name, record.get("error", "failed"), "", "", "", "", ""])
            continue
        shares = {k: statistics.mean(c[k] for c in record["composition"]) for k in record["composition"][0]}
        unsolved = "solved" in record and not any(record["solved"])  # no kept set found: nothing to share out
        rows.append([name, fmt_seconds(record["seconds_per_window"]),
                     *[("n/a" if unsolved else f"{v:.1f}") for v in shares.values()], _erasure_text(record)])
    lines += ["Where each method puts its attribution (share of its non-negative scores, %, mean over the examples):", "",
              table(["method", "seconds per window", "predicted answer", "question", "other passage", "[CLS]/[SEP]",
                     "search"], rows), ""]
    return lines + [f"![methods]({p})" for p in results["figures"]["side_by_side"]] + [""]


def _erasure_text(record: Mapping[str, Any]) -> str:
    if "solved" not in record:
        return ""
    budget = record["options"].get("budget")
    return "; ".join(f"size {s}, {n} evaluations" if ok else f"not solved within {budget}"
                     for ok, s, n in zip(record["solved"], record["size"], record["evaluations"]))


def _speed_section(results: Mapping[str, Any]) -> List[str]:
    sp = results["speed"]
    rows = [[k, fmt_seconds(v), fmt_ratio(sp["ratio_to_forward"][k])] for k, v in sp["per_window_seconds"].items()]
    lines = ["## Speed", "",
             f"Same run, same machine: {sp['windows']} analysed windows ({sp['mean_tokens']:.0f} real tokens on "
             f"average) in batches of {sp['batch_size']} (medians of repeats; IG timed once). DiffMask attributes "
             "every layer in one pass.", "",
             table(["", "seconds per window", "x forward"], rows), ""]
    steps = results.get("config", {}).get("speed", {}).get("ig_steps", 50)
    lines += [f"- DiffMask {mode}: {ratio:.1f}x faster than IG with {steps} steps." if ratio >= 1 else
              f"- DiffMask {mode}: {1 / ratio:.1f}x slower than IG with {steps} steps."
              for mode, ratio in sp["ig_over_diffmask"].items()]
    training = sp["training"]
    lines += ["", f"Training: one fine-tuning epoch over the {training['finetune_windows']} fine-tuning windows took "
                  f"{fmt_seconds(training['finetune_epoch_seconds'])} (timed when the model was fine-tuned). "
                  "DiffMask's training time per window seen (validation left out), and an epoch over the same windows "
                  "at that rate:", ""]
    rows = [[mode, fmt_seconds(training[mode]["seconds_per_window"]), fmt_seconds(training[mode]["epoch_seconds"]),
             fmt_ratio(training[mode]["ratio_to_finetune_epoch"])] if _fitted_here(results, mode) else
            [mode, "n/a", "n/a", f"n/a: not fitted whole in this run ({fitted_where(results['diffmask'][mode])})"]
            for mode in MODES if mode in training]
    return lines + [table(["DiffMask", "per window", "epoch", "x fine-tuning epoch"], rows), ""]


def _provenance(results: Mapping[str, Any]) -> str:
    r"""Which numbers the run computed: all of them, or all but fits read from
    the fit cache or gone on from a stopped fit's state."""
    earlier = [mode for mode in MODES if not _fitted_here(results, mode)]
    if not earlier:
        return "Every number below comes from this run."
    return (f"Every number below comes from this run; the DiffMask {' and '.join(earlier)} fit"
            f"{'s' if len(earlier) > 1 else ''} ran (wholly or in part) in earlier invocations with the same "
            "settings, through the fit cache (`DiffMask training` says where).")


def _fitted_here(results: Mapping[str, Any], mode: str) -> bool:
    r"""Whether ``mode``'s fit ran whole in this run: not read from the fit
    cache, not resumed from a stopped fit's state (its times are then an earlier
    invocation's, or this one's part alone)."""
    fit = (results.get("diffmask") or {}).get(mode) or {}
    return not (fit.get("stored") or fit.get("resumed"))


def _training_section(results: Mapping[str, Any]) -> List[str]:
    dm = results["diffmask"]
    rows = [[mode, fit_batches(dm[mode]), fit_batches(dm[mode]) * int(dm[mode]["options"].get("batch_size", 64)),
             results["model"]["diffmask_train_windows"],
             dm[mode]["selected_epoch"], "yes" if dm[mode]["feasible"] else "no", fmt_seconds(dm[mode]["seconds"]),
             fitted_where(dm[mode])]
            for mode in MODES]
    lines = ["## DiffMask training", "",
             f"Fitted on windows of the fine-tuning articles; {results['model']['diffmask_valid_windows']} others of "
             "them are held out from the fit: " + ("the fit's last probe is kept and its deterministic read-out "
             "scored there (`within the bound`: its KL at most eps x 1.25 at every layer)."
             if any(dm[mode].get("heldout") for mode in MODES) else
             "the sparsest epoch within the validation bound there is kept."), "",
             table(["mode", "steps", "windows seen", "training windows", "selected epoch", "within the bound", "fit time",
                    "fitted in"], rows), "",
             "A fit from the fit cache ran in an earlier invocation (its time is that one's); a fit that went on "
             "from a stopped fit's state gives this invocation's part of the time alone.", "",
             *[f"Options, {mode}: `{dm[mode]['options']}`." for mode in MODES], ""]
    return lines + convergence_section({mode: {"runs": [{"seed": results["seeds"][0], **dm[mode]}]} for mode in MODES})


def _time_section(results: Mapping[str, Any]) -> List[str]:
    r"""Where the time went: wall and CPU time per stage, the machine's load,
    and (full runs) the 90-minute target with the model cached."""
    stages = results.get("stages") or {}
    if not stages:
        return []
    rows = [[name, fmt_seconds(v["wall"]), fmt_seconds(v["cpu"])] for name, v in stages.items()]
    wall, cpu = sum(v["wall"] for v in stages.values()), sum(v["cpu"] for v in stages.values())
    load = results.get("load_average") or {}
    model = results["model"]
    # the target assumes the model cached: this run's fine-tuning left out of both
    total = wall - (0.0 if model["cached"] else model["fine_tune_seconds"])
    cpu_total = cpu - (0.0 if model["cached"] else sum(h.get("cpu_seconds", 0.0) for h in model.get("history") or []))
    lines = ["## Where the time went", "",
             f"Wall and CPU time (this process, every thread) of each stage; the machine's load average (1, 5, 15 "
             f"min) was {_load(load.get('start'))} at the start and {_load(load.get('end'))} at the end: other "
             "processes count in the wall time, not in the CPU time.", "",
             table(["stage", "wall", "CPU"], rows + [["all stages", fmt_seconds(wall), fmt_seconds(cpu)]]), ""]
    device = results.get("config", {}).get("device")
    if results.get("mode") == "full" and (device not in (None, "cpu") or not all(_fitted_here(results, m) for m in MODES)):
        where = f"it ran on `{device}`" if device not in (None, "cpu") else "its fits ran in earlier invocations"
        lines += [f"Target: the full run within 90 minutes on 2 CPU cores with the model cached: **not assessed** "
                  f"here: {where}.", ""]
    elif results.get("mode") == "full":
        ok = total <= 5400
        threads = (results.get("environment") or {}).get("threads", "?")
        lines += [f"Target: the full run within 90 minutes on 2 CPU cores with the model cached: {total / 60:.1f} min "
                  f"wall on {threads} torch thread(s) ({'the model from the cache' if model['cached'] else 'the fine-tuning of this run left out'}), "
                  f"{cpu_total / 60:.1f} min CPU: **{'met' if ok else 'missed'}**.", ""]
    return lines


def _load(values: Any) -> str:
    r"""A load average triple as text (``n/a`` when not recorded)."""
    return "n/a" if not values else ", ".join(f"{v:.2f}" for v in values)


def headline(results: Mapping[str, Any]) -> str:
    r"""One line of a run's numbers for the results' index: how many of the
    paper's observations hold here."""
    observations = results.get("observations") or []
    held = [o["key"] for o in observations if o.get("verdict") == "holds"]
    return f"{len(held)} of {len(observations)} of the paper's observations hold" + (
        f" ({', '.join(held)})" if held else "")
