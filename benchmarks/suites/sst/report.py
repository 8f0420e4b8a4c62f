"""The sst suite's prose: the markdown report, one function per section, and
the targets read against this run's numbers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from benchmarks.tasks.sst import LABEL_NAMES

from benchmarks.report import chosen_on_section, fmt, fmt_ratio, fmt_seconds, notes_section, table
from captum_diffmask.diffmask.fit.history import last_rows

from benchmarks.common.minilm.convergence import (constraint_binding_section, convergence_section,
                                                  multiplier_tolerance_section, probe_counts)
from benchmarks.common.minilm.fit_cache import fitted_where
from benchmarks.common.minilm.fitting import HELD_OUT_MARGIN
from benchmarks.suites.sst.scoring import aggregate_std, counted_layers, layer_means, layer_row
from benchmarks.suites.sst.settings import ATTRIBUTION_RATIO_MAX, IG_SPEEDUP_MIN, STABILITY_TARGETS, PAPER


def write_report(results: Mapping[str, Any], path: Any, json_name: str = "results.json") -> str:
    r"""Writes the suite's report (markdown) to ``path`` and returns its text."""
    model = results["model"]
    lines = [f"# {results['title']}", "",
             f"Suite `sst`, **{results.get('mode', '?')}** run on `{results['split']}` "
             f"({model['evaluated_sentences']} sentences), seeds {results['seeds']}{_stability_seeds(results)}, "
             f"{fmt_seconds(results.get('wall_seconds'))} in all. Command: `{results.get('command', '')}`.", ""]
    lines += _model_section(model)
    lines += _faithfulness_section(results["diffmask"])
    lines += _targets(results)
    lines += _depth_profile_section(results["diffmask"])
    lines += _paper_recipe_section(results)
    lines += _stability_section(results["diffmask"])
    lines += _cls_section(results)
    lines += _layers_kept_section(results)
    lines += ["## Per-layer heatmaps", "",
              "Tokens x layers for a few sentences; every panel normalised per layer by its largest absolute score "
              "(as the paper's figures). E = the embeddings (DiffMask: `hidden.0`; the other methods: the word "
              "embeddings); attention: max over heads, mean over query positions.", ""]
    lines += [f"![heatmap]({p})" for p in results["figures"]["heatmaps"]] + [""]
    lines += _speed_section(results["speed"])
    lines += _training_section(results["diffmask"], results["model"], _selects(results),
                               results["speed"]["per_sentence_seconds"]["forward"])
    lines += convergence_section(results["diffmask"])
    lines += multiplier_tolerance_section(results["diffmask"])
    lines += constraint_binding_section(results["diffmask"])
    lines += notes_section(results.get("notes") or [])
    lines += chosen_on_section(results)
    lines += [f"All numbers are in `{json_name}`; configuration and environment there too.", ""]
    text = "\n".join(lines)
    Path(path).write_text(text, encoding="utf-8")
    return text


def stability_of(record: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    r"""A mode's stability with its ``layers`` and ``masked_share_std``; a run
    from before the stability seeds has neither: its stability is over every
    layer of its runs."""
    st = record["stability"]
    if not st or "layers" in st:
        return st
    layers = [int(r["layer"]) for r in record["faithfulness"]["per_layer"]]
    return {**st, "layers": layers, "masked_share_std": aggregate_std([r["faithfulness"] for r in record["runs"]], layers)}


def _stability_seeds(results: Mapping[str, Any]) -> str:
    extra = results.get("stability_seeds")
    if not extra:
        return ""
    return f" at every layer and {extra['seeds']} at layers {extra['layers']} (for the stability)"


def _model_section(model: Mapping[str, Any]) -> List[str]:
    history = model.get("history") or []
    took = fmt_seconds(model["fine_tune_seconds"])
    return ["## The model", "",
            f"{model['source']} with {model['layers']} layers ({model['parameters'] / 1e6:.1f} M parameters), "
            f"fine-tuned on {model['train_sentences']} SST train sentences "
            f"({'from the cache' if model['cached'] else 'in this run'}; fine-tuning took {took} "
            f"when it ran, {len(history)} epochs, the {_kept_epoch(history)}). "
            f"**Dev accuracy {model['dev_accuracy']:.2f} %, dev macro-F1 {model['dev_macro_f1']:.2f}** "
            f"(the paper's BERT-base: macro-F1 {PAPER['unmasked_f1']}).", ""]


def _kept_epoch(history: List[Mapping[str, Any]]) -> str:
    r"""Which epoch the model holds, in the report's words: the last (the rule
    fixed in advance), or, for a model fine-tuned before that rule, the one
    the best dev macro-F1 chose."""
    kept = [h["epoch"] for h in history if h.get("selected")]
    if kept == [len(history)]:
        return "last kept"
    return f"epoch {kept[0] if kept else '?'} kept, chosen on dev macro-F1 (before the rule that keeps the last)"


def _faithfulness_section(dm: Mapping[str, Any]) -> List[str]:
    lines = ["## Faithfulness: the model with DiffMask's gates applied", "",
             "Deterministic gates (kept where the keep probability exceeds 0.5), gated-off positions replaced by the "
             "learned baseline; mean +- std over the seeds fitted at the layer. Input mode at layer k masks input "
             "tokens with the votes read from layers 0..k; hidden mode at layer k masks the states of layer k.", ""]
    for mode in ("input", "hidden"):
        faith = dm[mode]["faithfulness"]
        base = faith["unmasked"]
        resolved = all("f1_change_interval_width" in r for r in faith["per_layer"])
        rows = [[f"{r['layer']}", r.get("seeds", ""), f"{r['macro_f1']:.2f} +- {r['macro_f1_std']:.2f}",
                 f"{r['accuracy']:.2f}",
                 f"{r['masked_share']:.1f} +- {r['masked_share_std']:.1f}", f"{r['agreement']:.1f}"]
                + ([f"{r['f1_change_interval_width']:.1f}", fmt(r["changed_top2_gap"], 3)] if resolved else [])
                for r in faith["per_layer"]]
        extra = ["F1 change: 95 % interval width", "changed: median top-2 gap"] if resolved else []
        lines += [f"**{mode}** (unmasked: macro-F1 {base['macro_f1']:.2f}, accuracy {base['accuracy']:.2f})", "",
                  table(["layer", "seeds", "macro-F1", "accuracy %", "masked %", "same prediction %"] + extra, rows), ""]
        if resolved:
            lines += [f"The interval: a paired bootstrap of the macro-F1 change over the {mode} mode's scored sentences "
                      "(mean width over seeds, points); the changed predictions' median gap between their two most "
                      f"probable classes unmasked (mean over seeds; all sentences: {base['median_top2_gap']:.3f}).", ""]
    return lines


def _stability_section(dm: Mapping[str, Any]) -> List[str]:
    r"""Stability both ways: the std across seeds of every keep probability and
    of each layer's masked share, and the swap test (each seed's mask under one
    objective, the masks compared position by position)."""
    rows = []
    for mode in ("input", "hidden"):
        st, swap = stability_of(dm[mode]), dm[mode].get("swap")
        row = [mode, st["seeds"] if st else 1, ", ".join(str(k) for k in st["layers"]) if st else "",
               fmt(st["mean_std"], 4) if st else "n/a (one seed)", fmt(st["p95_std"], 3) if st else "",
               fmt(st["masked_share_std"], 3) if st else ""]
        if swap:
            pairs = swap["pairs"]
            row += [fmt(sum(p["disagreement"] for p in pairs) / len(pairs), 3), fmt(max(p["masked_gap"] for p in pairs), 3),
                    fmt(max(p["kl_gap"] for p in pairs), 4)]
        else:
            row += ["", "", ""]
        rows.append(row + [PAPER[f"{mode}_std"]])
    return ["## Stability across seeds, both ways", "",
            table(["DiffMask", "seeds", "layers", "std of each keep probability (mean)", "95th percentile",
                   "std of each layer's masked share (mean over layers)", "swap test: masks differ at (mean)",
                   "masked share gap (max)", "KL gap (max)", "paper (definition not given)"], rows), "",
            "The paper's figure does not say what its std is taken over; here both readings: the std across seeds "
            "of every (sentence, token, layer) keep probability, and of each layer's masked share, over every seed "
            "fitted at the layers given. The swap test "
            "scores every seed's deterministic mask under the same objective on the held-out train sentences: the "
            "share of real positions where two seeds' masks differ (mean over pairs and layers), and the largest "
            "gaps of the objective's two sides, the masked share and the mean KL (nats), over pairs and layers. "
            "Masks that differ while both gaps are small say the objective cannot tell them apart; large gaps say "
            "the optimiser, not the objective, sets the spread.", ""] + _swap_layers_section(dm)


def _swap_layers_section(dm: Mapping[str, Any]) -> List[str]:
    r"""The swap test per layer: the pairs of seeds whose objective values agree
    within the certificate's tolerances (masked share, KL as a share of eps),
    and how far their masks differ, beside the pairs whose values do not."""
    certificates = [run["certificate"] for mode in ("input", "hidden") for run in dm[mode]["runs"]
                    if run.get("certificate")]
    if not certificates or not any(dm[mode].get("swap") for mode in ("input", "hidden")):
        return []
    tol, eps = certificates[0]["tolerances"], certificates[0]["eps"]
    most_masked, most_kl = tol["masked_share"], tol["tol_kl"] * eps
    rows = []
    for mode in ("input", "hidden"):
        swap = dm[mode].get("swap")
        for layer in (swap or {}).get("layers", []):
            pairs = [p for p in swap["pairs"] if p["layer"] == layer]
            equal = [p for p in pairs if p["masked_gap"] <= most_masked and p["kl_gap"] <= most_kl]
            other = [p for p in pairs if p not in equal]
            rows.append([mode, layer, len(pairs), len(equal), _mean_disagreement(equal), _mean_disagreement(other)])
    return ["Per layer, the pairs of seeds whose objective values agree within the certificate's tolerances "
            f"(masked share gap <= {most_masked:g}, KL gap <= {tol['tol_kl']:g} x eps = {most_kl:g}; the "
            "certificate's, fixed in advance), and how far the masks differ in those pairs and in the others:", "",
            table(["mode", "layer", "pairs", "objectives agree", "masks differ at (mean), agreeing pairs",
                   "masks differ at (mean), the others"], rows), ""]


def _mean_disagreement(pairs: List[Mapping[str, Any]]) -> str:
    return fmt(sum(p["disagreement"] for p in pairs) / len(pairs), 3) if pairs else "-"


def _cls_section(results: Mapping[str, Any]) -> List[str]:
    lines = ["## Which state does the last layer keep? [CLS] share", "",
             f"Share of sentences whose last-layer (layer {results['model']['layers']}) [CLS] state gets the strictly "
             "largest hidden-state attribution (ties are counted apart). The paper: DiffMask 99 %, bottleneck 71 %.", ""]
    rows = [[name, f"{v['cls_share']:.1f}", f"{v['cls_tie_share']:.1f}", v["sentences"]] for name, v in results["cls_share"].items()]
    lines += [table(["method", "[CLS] largest %", "[CLS] tied %", "sentences"], rows), ""]
    failed = {k: v for k, v in results["methods"].items() if v.get("status") != "ok"}
    for name, record in failed.items():
        lines.append(f"- {name} failed: {record['error']}")
    return lines


def _layers_kept_section(results: Mapping[str, Any]) -> List[str]:
    kept = results["layers_kept"]
    lines = ["## Layers a token is kept, by group", "",
             f"Expected number of layers (of {results['model']['layers'] + 1}) at which a token is kept: the sum of its "
             "keep probabilities, averaged over seeds and over the tokens of a group (a word's word pieces belong to "
             "the word's group).", ""]
    for kind in ("sentiment", "pos"):
        if kind not in kept["input"]:
            continue
        names = list(kept["input"][kind])
        if kind == "sentiment":
            names = [g for g in ["[CLS]", *LABEL_NAMES, "[SEP]"] if g in names]
        rows = [[g, fmt(kept["input"][kind][g]["mean_layers"], 2), fmt(kept["hidden"][kind].get(g, {}).get("mean_layers"), 2),
                 kept["input"][kind][g]["tokens"]] for g in names]
        lines += [f"By {'word sentiment label' if kind == 'sentiment' else 'part of speech (spaCy UPOS)'}:", "",
                  table(["group", "input", "hidden", "tokens"], rows), ""]
    return lines + [f"![layers kept]({results['figures']['layers_kept']})", ""]


def _speed_section(sp: Mapping[str, Any]) -> List[str]:
    lines = ["## Speed", "",
             f"Same run, same machine. Attribution of {sp['sentences']} sentences in batches of {sp['batch_size']} "
             "(median of repeats), per sentence and as a ratio to one plain forward pass; DiffMask attributes every "
             "layer in one pass.", ""]
    rows = [[k, fmt_seconds(v), fmt_ratio(sp["ratio_to_forward"][k])] for k, v in sp["per_sentence_seconds"].items()]
    lines += [table(["", "seconds per sentence", "x forward"], rows), ""]
    for mode, ratio in sp["diffmask_vs_ig"].items():
        lines.append(f"- DiffMask {mode} is {ratio:.0f}x faster than Integrated Gradients.")
    lines += ["", f"Training: one fine-tuning epoch over the same train sentences, estimated from timed AdamW steps "
                  f"on a copy of the model: {fmt_seconds(sp['finetune_epoch_seconds_estimate'])}.", ""]
    rows = [[mode, fmt_seconds(v["epoch_seconds"]), v.get("layers_per_batch", 1), fmt_ratio(v["ratio_to_finetune_epoch"])]
            for mode, v in sp["training"].items()]
    lines += [table(["DiffMask", "training epoch (mean)", "layers trained per batch",
                      "x fine-tuning epoch, per layer per batch"], rows), ""]
    lines += ["An epoch that trains every layer on every batch costs about as many one-layer epochs "
              "(the paper's epoch draws one layer per batch) as it trains layers per batch; the ratio divides "
              "by that number.", ""]
    return lines + _fit_step_lines(sp.get("fit_steps", {}))


def _selects(results: Mapping[str, Any]) -> bool:
    r"""Whether the run's fits restored a selected checkpoint (the suite's earlier recipe)."""
    return bool(results.get("config", {}).get("diffmask", {}).get("select_checkpoint", True))


def _validation_line(model: Mapping[str, Any], selects: bool) -> str:
    if model.get("validation_from", "dev") == "dev":
        return "Checkpoint selected on dev sentences (the split the report scores); fitted on every train sentence."
    if not selects:
        return (f"Fitted on {model['fit_sentences']} train sentences; no checkpoint selected (the fit's last probe is "
                f"kept), its deterministic read-out scored on {model['validation_sentences']} other train sentences "
                "set aside from the fit (no dev sentence is read by a fit).")
    return (f"Fitted on {model['fit_sentences']} train sentences; the checkpoint selected on "
            f"{model['validation_sentences']} other train sentences, set aside from the fit (no dev sentence is read "
            f"by the fit or its selection).")


def _paper_recipe_section(results: Mapping[str, Any]) -> List[str]:
    r"""The paper's recipe beside fit's defaults, per mode and layer (absent
    from runs made without it)."""
    paper = results.get("paper_recipe")
    if not paper:
        return []
    options = paper["diffmask"]["input"]["runs"][0]["options"]
    lines = ["## The paper's recipe, as a reference", "",
             f"The paper's sentiment recipe (`PAPER_FIT`: Lookahead RMSprop at lr 3e-4, the multiplier at 0.1, one "
             f"layer drawn per batch, batch 64, KL <= 0.5, the sum L0, tied input votes) for {paper['epochs']} epochs "
             "(the paper: 100; the CPU budget's), seeds " + ", ".join(str(s) for s in paper["seeds"]) + ", on the same "
             "model and sentences, no checkpoint selected (the authors kept the sparsest epoch within a held-out "
             "bound); beside it, fit's defaults above (mean over their seeds, every probe, counted or not). "
             f"Options: `{options}`.", ""]
    for mode in ("input", "hidden"):
        runs, ours = paper["diffmask"][mode]["runs"], results["diffmask"][mode]["faithfulness"]
        eps = float(runs[0]["options"]["eps"])
        rows = []
        for k, row in enumerate(ours["per_layer"]):
            cells = [_paper_cells(run, k) for run in runs]
            rows.append([k, *["; ".join(c[i] for c in cells) for i in range(4)], f"{row['masked_share']:.1f}",
                         f"{row['macro_f1'] - ours['unmasked']['macro_f1']:+.2f}"])
        lines += [f"**{mode}**", "", table(["layer", "verdict", "masked %", "macro-F1 change",
                                             f"held-out KL (<= {HELD_OUT_MARGIN * eps:g})", "fit's defaults: masked %",
                                             "fit's defaults: macro-F1 change"], rows), ""]
    return lines


def _paper_cells(run: Mapping[str, Any], layer: int) -> List[str]:
    faith = run["faithfulness"]
    status = (run.get("convergence") or {}).get(str(layer), {}).get("status", "?")
    kl = ((run.get("heldout") or {}).get(str(layer)) or {}).get("kl")
    return [status, f"{faith['per_layer'][layer]['masked_share']:.1f}",
            f"{faith['per_layer'][layer]['macro_f1'] - faith['unmasked']['macro_f1']:+.2f}",
            "" if kl is None else f"{fmt(kl, 4)} {'ok' if probe_counts(status, kl, run['options'].get('eps'))[1] else 'over'}"]


def _step_cost(run: Mapping[str, Any], forward: float) -> str:
    r"""Seconds a step, and as a multiple of one forward pass of a batch; not
    for a resumed fit, whose seconds are its last invocation's alone."""
    if run.get("resumed"):
        return "n/a (resumed)"
    step = run["seconds"] / max(int(run.get("steps") or 0), 1)
    batch = int(run.get("options", {}).get("batch_size", 32))
    return f"{fmt_seconds(step)} ({step / (forward * batch):.1f}x)"


def _fit_step_lines(fit_steps: Mapping[str, Mapping[str, float]]) -> List[str]:
    r"""A fit step with the layers' masked passes stacked (``stack_layers``)
    against the other choice, per mode; nothing when the run did not time them."""
    if not fit_steps:
        return []
    rows = []
    for mode, seconds in fit_steps.items():
        (default, default_s), (other, other_s) = list(seconds.items())[:2]
        rows.append([mode, f"{fmt_seconds(default_s)} ({default})", f"{fmt_seconds(other_s)} ({other})",
                     fmt_ratio(other_s / default_s)])
    return ["A fit step with the suite's settings, on the same batches, in this process (the least of two rounds, "
            "the order alternating): the default `stack_layers` against the other choice (the layers' masked passes "
            "as one pass over the batch repeated, or one pass per layer; the same arithmetic):", "",
            table(["mode", "a step (default)", "a step (other)", "other / default"], rows), ""]


def _training_section(dm: Mapping[str, Any], model: Mapping[str, Any], selects: bool, forward: float) -> List[str]:
    r"""Per fit: steps, verdicts, time, a step's cost against one forward pass of
    a batch (``forward``: seconds per sentence of one plain forward pass, from
    this run's speed section), peak resident memory, and where it was fitted."""
    rows = []
    for mode in ("input", "hidden"):
        for run in dm[mode]["runs"]:
            counted = counted_layers(run)
            settled = sum(c["settled"] for c in counted.values())
            within = sum(c["settled"] and c["within"] for c in counted.values())
            certified = "not measured" if run.get("certificate") is None else sum(c["certified"] for c in counted.values())
            rows.append([mode, run["seed"], run.get("steps", ""), f"{settled} of {len(counted)}", within, certified,
                         run["selected_epoch"] if selects else "none", fmt_seconds(run["seconds"]),
                         _step_cost(run, forward), fmt(run.get("peak_rss_gb"), 2), fitted_where(run)])
    return ["## DiffMask training", "", _validation_line(model, selects), "",
            table(["mode", "seed", "steps (most at a layer)", "layers settled", f"settled, held-out KL <= eps x {HELD_OUT_MARGIN:g}",
                   "certified (count)", "selected epoch", "fit time", "a step (x forward pass of a batch)", "peak memory GB", "fitted in"], rows), "",
            "A step trains every layer not yet frozen on one batch; the forward pass is this run's (speed section: "
            "float32, on the run's threads), while the fits' passes ran in their own precision and, in worker "
            "processes, on one torch thread each, side by side. Peak memory: the fitting process's resident peak. "
            "A fit from the cache ran in another invocation: its time is that invocation's; a resumed fit's time is "
            "its last invocation's part alone.", "",
            *[_options_line(mode, dm[mode]["runs"]) for mode in ("input", "hidden")], ""]


def _options_line(mode: str, runs: List[Mapping[str, Any]]) -> str:
    r"""The fits' options of one mode: those every seed shares, then each option
    that differs with its value per seed (a fit from the cache keeps the cap it
    was fitted with, e.g. one settled within an earlier, smaller cap)."""
    shared = {k: v for k, v in runs[0]["options"].items() if all(r["options"].get(k) == v for r in runs)}
    differing = sorted({k for r in runs for k in r["options"]} - set(shared))
    line = f"Options, {mode}: `{shared}`"
    if differing:
        line += "; by seed: " + "; ".join(
            f"`{k}` " + ", ".join(f"{r['options'].get(k)} (seed {r['seed']})" for r in runs) for k in differing)
    return line + "."


def _depth_profile_section(dm: Mapping[str, Any]) -> List[str]:
    r"""Per mode and layer, the probes that count (settled by the fit's own
    verdict, the held-out read-out within the bound) and what each masks."""
    lines = ["## The depth profile on the probes that count", "",
             f"A probe counts when its fit's own verdict is `converged` or `needed` and its deterministic read-out's "
             f"KL on the held-out train sentences is at most eps x {HELD_OUT_MARGIN:g}; per layer, each counted "
             "seed's masked share and macro-F1 change on the scored split, and its last training epoch's KL of the "
             "sampled and of the deterministic (deployed) gates. A layer no probe counts at says why.", ""]
    for mode in ("input", "hidden"):
        runs = dm[mode]["runs"]
        rows = [_profile_row(runs, k) for k in range(len(runs[0]["faithfulness"]["per_layer"]))]
        lines += [f"**{mode}**", "", table(["layer", "counted seeds", "masked %", "macro-F1 change",
                                             "training KL sampled / deployed"], rows), ""]
    return lines


def _profile_row(runs: List[Mapping[str, Any]], layer: int) -> List[Any]:
    counted, why = [], []
    for run in runs:
        state = counted_layers(run).get(layer)
        if state is None:  # a stability seed fitted at other layers
            continue
        if state["counts"]:
            counted.append(run)
        else:
            status = (run.get("convergence") or {}).get(str(layer), {}).get("status", "?")
            why.append(f"seed {run['seed']}: {status}{'' if state['within'] else ', held-out KL over'}")
    if not counted:
        return [layer, "none (" + "; ".join(why) + ")", "", "", ""]
    faith = [run["faithfulness"] for run in counted]
    masked = ", ".join(f"{layer_row(f, layer)['masked_share']:.1f}" for f in faith)
    change = ", ".join(f"{layer_row(f, layer)['macro_f1'] - f['unmasked']['macro_f1']:+.2f}" for f in faith)
    kls = [last_rows(run.get("history") or []).get(layer, {}) for run in counted]
    kl = ", ".join(f"{fmt(r.get('kl'), 4)} / {fmt(r.get('kl_deployed'), 4)}" for r in kls)
    return [layer, ", ".join(str(run["seed"]) for run in counted), masked, change, kl]


def _targets(results: Mapping[str, Any]) -> List[str]:
    # The reading of the targets, the same for both modes: the share masked and the
    # masked model's macro-F1 are averaged over the probes of every layer (each
    # probe reads the states up to its layer), as one number per mode like the
    # paper's; the lowest layer is printed beside so that no layer hides.
    dm = results["diffmask"]
    lines = ["Targets (masked share and macro-F1 averaged over the layers' probes, seeds averaged):", ""]
    for mode, least in (("input", 45.0), ("hidden", 65.0)):
        faith = dm[mode]["faithfulness"]
        base = faith["unmasked"]["macro_f1"]
        masked, f1 = layer_means(faith)
        worst = min(faith["per_layer"], key=lambda r: r["macro_f1"])
        ok = masked >= least and f1 >= base - 1.0
        lines.append(f"- {mode}: {masked:.1f} % masked (target >= {least:.0f} %), macro-F1 {f1:.2f} vs {base:.2f} "
                     f"unmasked (target: within 1 point; lowest layer: {worst['macro_f1']:.2f} at layer "
                     f"{worst['layer']}): **{'met' if ok else 'missed'}**")
        lines.append(_counted_target(mode, dm[mode]["runs"], least, base))
        lines.append(_layers_within_target(mode, faith))
    for mode, most in (("input", 0.05), ("hidden", 0.03)):
        st = stability_of(dm[mode])
        if st:
            met = "met" if st["mean_std"] <= most else "missed"
            lines.append(f"- stability, {mode}: mean std of the attributions across {st['seeds']} seeds (layers "
                         f"{', '.join(str(k) for k in st['layers'])}) {st['mean_std']:.4f} (target <= {most}): **{met}**")
    lines += _stability_targets(results)
    lines += _verdict_targets(dm)
    lines += _speed_targets(results)
    return lines + [""]


def _counted_target(mode: str, runs: List[Mapping[str, Any]], least: float, base: float) -> str:
    r"""The same target on the probes that count alone (settled, held-out read-out
    within the bound): their mean masked share and macro-F1 over (layer, seed),
    and the lowest macro-F1 among them."""
    probes = [(run, int(layer)) for run in runs for layer, state in counted_layers(run).items() if state["counts"]]
    total = sum(len(run["faithfulness"]["per_layer"]) for run in runs)
    if not probes:
        return f"- {mode}, on the probes that count: none of {total} counts: **missed**"
    rows = [(run, layer_row(run["faithfulness"], layer)) for run, layer in probes]
    masked = sum(row["masked_share"] for _, row in rows) / len(rows)
    f1 = sum(row["macro_f1"] for _, row in rows) / len(rows)
    worst_run, worst = min(rows, key=lambda pair: pair[1]["macro_f1"])
    ok = masked >= least and f1 >= base - 1.0
    return (f"- {mode}, on the {len(probes)} of {total} probes that count: {masked:.1f} % masked, macro-F1 {f1:.2f} "
            f"(lowest: {worst['macro_f1']:.2f} at layer {worst['layer']}, seed {worst_run['seed']}): "
            f"**{'met' if ok else 'missed'}**")


def _layers_within_target(mode: str, faith: Mapping[str, Any]) -> str:
    r"""The per-layer reading of faithfulness: at how many layers the
    masked model's macro-F1 (seeds averaged) is within one point of the
    unmasked model's (target: all but one)."""
    base = faith["unmasked"]["macro_f1"]
    rows = faith["per_layer"]
    within = [row["layer"] for row in rows if row["macro_f1"] >= base - 1.0]
    below = ", ".join(f"{row['layer']} ({row['macro_f1'] - base:+.2f})" for row in rows if row["layer"] not in within)
    ok = len(within) >= len(rows) - 1
    return (f"- {mode}, per layer: macro-F1 within one point of the unmasked model's at {len(within)} of {len(rows)} "
            f"layers (target >= {len(rows) - 1}; below: {below or 'none'}): **{'met' if ok else 'missed'}**")


def _stability_targets(results: Mapping[str, Any]) -> List[str]:
    dm, lines = results["diffmask"], []
    for mode, (most, least) in STABILITY_TARGETS.items():
        st, faith = dm[mode]["stability"], dm[mode]["faithfulness"]
        if not st:
            continue
        masked, f1 = layer_means(faith)
        base = faith["unmasked"]["macro_f1"]
        ok = st["mean_std"] <= most and masked >= least and f1 >= base - 1.0
        lines.append(f"- fit's defaults, {mode}: std across seeds {st['mean_std']:.4f} (target <= {most}), {masked:.1f} % "
                     f"masked (target >= {least} %), macro-F1 {f1:.2f} vs {base:.2f} (target: within 1 point): "
                     f"**{'met' if ok else 'missed'}**")
    return lines


def _verdict_targets(dm: Mapping[str, Any]) -> List[str]:
    r"""The share of probes (mode x layer x seed) settled by the fit's own verdict
    (target 90 %), how many of those keep the held-out bound (target: all), and,
    where the certificate was measured, the share it counts (target 90 %)."""
    lines, totals = [], [0, 0, 0, 0, 0]
    for mode in ("input", "hidden"):
        states = [c for run in dm[mode]["runs"] for c in counted_layers(run).values()]
        settled = [c for c in states if c["settled"]]
        within = sum(c["within"] for c in settled)
        measured = [c for c in states if c["certified"] is not None]
        totals = [totals[0] + len(states), totals[1] + len(settled), totals[2] + within,
                  totals[3] + len(measured), totals[4] + sum(c["counts"] for c in measured)]
        lines.append(f"- verdicts, {mode}: {len(settled)} of {len(states)} probes settled (`converged` or `needed`), "
                     f"{within} of them within eps x {HELD_OUT_MARGIN:g} on the held-out train sentences")
    probes, settled, within, measured, counts = totals
    ok = probes and settled >= 0.9 * probes and within == settled
    lines.append(f"- verdicts, both modes: {settled} of {probes} probes settled ({100.0 * settled / max(probes, 1):.0f} %, "
                 f"target >= 90 %), {within} of the {settled} within the held-out bound (target: all): "
                 f"**{'met' if ok else 'missed'}**")
    if measured:
        lines.append(f"- the certificate (`captum_diffmask.certify`): {counts} of {measured} probes count, settled, "
                     f"within the bound and still when trained further ({100.0 * counts / measured:.0f} %, target "
                     f">= 90 %; {_continued(dm)}): **{'met' if counts >= 0.9 * measured else 'missed'}**")
    return lines


def _continued(dm: Mapping[str, Any]) -> str:
    r"""How the certificates' further steps were taken: going on from each fit's
    state (its optimiser states), or with fresh optimiser states."""
    fits = [run["certificate"] for mode in ("input", "hidden") for run in dm[mode]["runs"] if run.get("certificate")]
    going_on = sum(bool(c.get("continued")) for c in fits)
    if going_on == len(fits):
        return "the further steps going on from each fit's state, its optimiser states"
    return (f"the further steps going on from the fit's state in {going_on} of {len(fits)} fits, "
            "fresh optimiser states in the others")


def _speed_targets(results: Mapping[str, Any]) -> List[str]:
    sp, lines = results["speed"], []
    for mode, v in sp["training"].items():
        ratio = v["ratio_to_finetune_epoch"]
        lines.append(f"- training epoch (one layer per batch), {mode}: {ratio:.2f}x one fine-tuning epoch (target <= 1.2x): "
                     f"**{'met' if ratio <= 1.2 else 'missed'}**")
    ig_steps = results.get("config", {}).get("speed", {}).get("ig_steps", 50)
    for mode in ("input", "hidden"):
        key = f"DiffMask {mode}"
        if key in sp["ratio_to_forward"]:
            ratio, vs_ig = sp["ratio_to_forward"][key], sp["diffmask_vs_ig"].get(mode, math.nan)
            met = ratio <= ATTRIBUTION_RATIO_MAX and vs_ig >= IG_SPEEDUP_MIN
            lines.append(f"- attribution, {mode}: {ratio:.2f}x one forward pass (target <= {ATTRIBUTION_RATIO_MAX}x), "
                         f"{vs_ig:.0f}x faster than IG with {ig_steps} steps (target >= {IG_SPEEDUP_MIN}x with 50 steps): "
                         f"**{'met' if met else 'missed'}**")
    wall = results.get("wall_seconds")
    if wall is not None and results.get("mode") == "full":
        lines.append(_whole_run_target(results, wall))
    return lines


def _whole_run_target(results: Mapping[str, Any], wall: float) -> str:
    r"""The run-time target, judged only on a run whose every DiffMask fit ran
    in it from the start: a fit from the fit cache or resumed from a stopped
    fit's state ran (in part) in another invocation, and the fits' training
    epochs across invocations are given instead."""
    fits = [run for mode in ("input", "hidden") for run in results["diffmask"][mode]["runs"]]
    paper = results.get("paper_recipe") or {}
    fits += [run for mode in ("input", "hidden") for run in paper.get("diffmask", {}).get(mode, {}).get("runs", [])]
    carried = [run for run in fits if run.get("stored") or run.get("resumed")]
    model = results["model"]
    if carried:
        epochs = sum(sum(run.get("epoch_seconds", [])) for run in fits)
        return (f"- the whole run: not judged in one invocation: {len(carried)} of its {len(fits)} DiffMask fits came "
                f"from the fit cache or resumed a stopped fit; this invocation took {wall / 60:.1f} min, and the fits' "
                f"training epochs alone, across invocations, sum to {epochs / 60:.0f} min "
                f"({results.get('config', {}).get('workers', 1)} fit(s) side by side) (target <= 90 min)")
    total = wall + (model["fine_tune_seconds"] if model["cached"] else 0)
    return (f"- the whole run: {wall / 60:.1f} min (target <= 90 min, fine-tuning included when it is not "
            f"cached: {model['fine_tune_seconds'] / 60:.1f} min when it ran): **{'met' if total <= 5400 else 'missed'}**")


def headline(results: Mapping[str, Any]) -> str:
    r"""One line of a run's numbers for the results' index: per mode, the layer
    where masking moves macro-F1 most, and the spread of the attributions
    across seeds."""
    parts = []
    for mode, record in (results.get("diffmask") or {}).items():
        faith = record.get("faithfulness") or {}
        unmasked = (faith.get("unmasked") or {}).get("macro_f1")
        layers = faith.get("per_layer") or []
        if unmasked is None or not layers:
            continue
        worst = min(layers, key=lambda row: row["macro_f1"] - unmasked)
        spread = (record.get("stability") or {}).get("mean_std")
        parts.append(f"{mode}: macro-F1 {worst['macro_f1'] - unmasked:+.2f} at worst (layer {worst['layer']}), "
                     f"seed std {spread:.3f}" if spread is not None else
                     f"{mode}: macro-F1 {worst['macro_f1'] - unmasked:+.2f} at worst (layer {worst['layer']})")
    return "; ".join(parts)
