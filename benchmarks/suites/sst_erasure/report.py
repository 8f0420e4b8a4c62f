"""The sst-erasure suite's markdown report, one function per table (the
sentences are :mod:`.prose`'s)."""

from __future__ import annotations

import math
import os
from typing import Any, List, Mapping

from benchmarks.report import (
    checks_section, chosen_on_section, configuration_section, environment_section, fmt, fmt_seconds, notes_section, reproduce_command,
    run_line, table,
)
from benchmarks.suites.sst_erasure.prose import budgets_paragraphs, MISS_LABELS, row_label, versus_paragraph
from benchmarks.suites.sst_erasure.settings import DESCRIPTION, gru_selected_on_dev, MASK_METHODS, METRICS, PAPER, SCORE_KEYS


def write_report(results: Mapping[str, Any], path: Any, json_name: str = "results.json") -> str:
    r"""
    Writes the suite's markdown report (the tables of this experiment: the
    paper's Table 2 beside ours, the top-k methods, erasure statistics, speed).

    Args:

        results (Mapping): the run's results with the runner's keys.
        path (str or PathLike): the report file.
        json_name (str, optional): the results file beside it. Default: ``"results.json"``

    Returns:
        *str*: the markdown.
    """
    methods = results.get("methods", {})
    lines: List[str] = [f"# {results.get('title', 'SST erasure agreement')}", ""]
    lines.append(run_line(results, results.get("suite", "sst-erasure"), f"run on `{results.get('split')}`",
                          results.get("wall_seconds", results.get("suite_seconds"))))
    lines += ["", DESCRIPTION[0].upper() + DESCRIPTION[1:] + ".", ""]
    lines += _table2_section(results)
    lines += _protocol_section(results)
    lines += _seeds_section(methods)
    lines += _comparison_section(results)
    lines += _budgets_section(results)
    lines += _misses_section(methods)
    lines += _top_k_section(methods)
    lines += _all_solved_section(methods)
    lines += _speed_section(methods)
    lines += _erasure_section(results)
    lines += checks_section(results)
    lines += _failures_section(methods)
    for figure in results.get("figures") or []:
        lines += ["## Figure", "", f"![{os.path.basename(figure['file'])}]({figure['file']})", "", figure.get("caption", ""), ""]
    lines += notes_section(results.get("notes") or [])
    lines += _closing_sections(results, json_name)
    text = "\n".join(lines)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return text


def _cell(record: Mapping[str, Any], key: str) -> str:
    # a method that did not run shows its status in every score column
    return fmt(record.get(key), 2) if record.get("status") == "ok" else str(record.get("status", "n/a"))


def _mask_rows(methods: Mapping[str, Any]) -> List[str]:
    return [name for name in MASK_METHODS if name in methods]


def _table2_section(results: Mapping[str, Any]) -> List[str]:
    methods = results.get("methods", {})
    paper = results.get("paper", PAPER)
    rows = []
    for name in _mask_rows(methods):
        record = methods[name]
        row: List[Any] = [row_label(name, record)]
        for key in ("precision", "recall", "f1", "optimality", "l0"):
            ours = _cell(record, key)
            std = record.get("std_over_seeds", {}).get(key)
            row += [ours + (f" ± {std:.2f}" if std is not None and record.get("status") == "ok" else ""),
                    fmt(paper.get(name, {}).get(key), 2)]
        row.append(_cell(record, "sufficiency"))
        rows.append(row)
    headers = ["method"]
    for key in ("precision", "recall", "F1", "optimality", "L0"):
        headers += [f"{key}, ours", f"{key}, paper"]
    headers.append("sufficiency, ours")
    lines = ["## Per-example masks against exact erasure (the paper's Table 2)", "", table(headers, rows), "",
             "All in percent, each the mean over scored sentences of a per-sentence value, then the mean ± std over "
             "the seeds. Precision, recall and F1 of the tokens the deterministic mask keeps (gate open with "
             "probability > 0.5) against the optimal set closest to them; optimality: the mask keeps the predicted "
             "class with exactly the optimal number of tokens; L0: share of tokens kept; sufficiency: the mask keeps "
             "the predicted class. A row's mask comes from the method's own objective unless it is marked "
             "oracle-selected.", ""]
    if results.get("paper_source"):
        lines += [f"Paper: {results['paper_source']}", ""]
    return lines


def _protocol_section(results: Mapping[str, Any]) -> List[str]:
    r"""Where this run's protocol differs from the paper's, said from its own record."""
    config, model, erasure = results.get("config", {}), results.get("model", {}), results.get("erasure", {})
    options = config.get("method_options", {}).get("PerExampleDiffMask", {})
    peaked = model.get("peakedness_searched") or {}
    unit = "words" if erasure.get("unit") == "word" else "word pieces ([CLS] and [SEP] included)"
    rows = [
        ["vectors", "BERT-base word embeddings, 768-d",
         f"frozen {model.get('embeddings')} vectors, {model.get('embedding_dim')}-d"
         + (" (a word: the mean of its pieces)" if erasure.get("unit") == "word" else "")
         + "; MiniLM is the BERT-family model this project has offline"],
        ["classifier", "GRU(768 -> 768), last state, 5 classes; accuracy not reported",
         f"GRU({model.get('embedding_dim')} -> {model.get('hidden_size')}), the same head; dev accuracy "
         f"{fmt(100 * model.get('dev_accuracy', math.nan), 2)}%, mean probability of the predicted class "
         f"{fmt(100 * peaked.get('max_probability', math.nan), 1)}% on the searched sentences"],
        ["the cut", "sentences of up to 25 words, 54% of the data",
         f"at most {erasure.get('max_tokens')} {unit}: {fmt(erasure.get('within_cut_share'), 1)}% of "
         f"{results.get('split')}"],
        ["baseline", "zeros in the authors' code (per-example gates, the QA notebook's exact search)",
         results.get("baseline", {}).get("kind", "")],
        ["the masks' constraint", "not stated; the authors' per-example code bounds KL(original || masked)",
         ("the log-loss of the predicted class against its strongest rival" if options.get("divergence") == "prediction"
          else "KL(original || masked)") + f" <= {options.get('eps')}, chosen on train sentences"],
        ["the returned mask", "not stated",
         f"{options.get('select', 'last')}: the sparsest deterministic mask within the constraint, checked every "
         f"{options.get('check_every')} of {options.get('steps')} steps"],
    ]
    return ["## Where the protocol differs from the paper's", "",
            table(["", "the paper (De Cao et al. 2020, and the authors' code)", "this run"], rows), "",
            "The paper's script for this table was never released; the authors' per-example classes for the GRU "
            "do not run as released, so its settings beyond what the paper states are unknown.", ""]


def _budgets_section(results: Mapping[str, Any]) -> List[str]:
    r"""The per-example rows' tuning budgets and what they say (:func:`budgets_paragraphs`)."""
    paragraphs = budgets_paragraphs(results)
    if not paragraphs:
        return []
    return ["## Tuning budgets", ""] + [line for paragraph in paragraphs for line in (paragraph, "")]


def _seeds_section(methods: Mapping[str, Any]) -> List[str]:
    seed_rows = [[f"`{name}`", str(row["seed"])] + [fmt(row[key], 2) for key in SCORE_KEYS]
                 for name in _mask_rows(methods) for row in methods[name].get("per_seed", [])]
    seed_rows += [[f"`{name}`", "std"] + [fmt(methods[name]["std_over_seeds"][key], 2) for key in SCORE_KEYS]
                  for name in _mask_rows(methods) if methods[name].get("std_over_seeds")]
    if not seed_rows:
        return []
    return ["## Per-example masks, seed by seed", "",
            table(["method", "seed", "precision", "recall", "F1", "optimality", "L0", "sufficiency"], seed_rows), "",
            "The table above gives the means over these seeds; std: the standard deviation over them.", ""]


def _comparison_section(results: Mapping[str, Any]) -> List[str]:
    comparisons = results.get("comparisons") or []
    if not comparisons:
        return []
    rows = []
    for c in comparisons:
        for key, label in (("f1", "F1"), ("optimality", "optimality"), ("l0", "L0")):
            ci = c["metrics"][key]
            rows.append([f"`{c['first']}` − `{c['second']}`", label, f"{ci['difference']:+.2f}",
                         f"[{ci['low']:+.2f}, {ci['high']:+.2f}]", "yes" if ci["low"] > 0 or ci["high"] < 0 else "no"])
    count = comparisons[0]["metrics"]["f1"]["examples"]
    resamples = comparisons[0]["metrics"]["f1"]["resamples"]
    lines = ["## DiffMask against REINFORCE: paired bootstrap", "",
             table(["difference", "score", "mean (points)", "95% CI", "0 outside"], rows), "",
             f"Each sentence's score is its mean over the seeds; the {count} scored sentences are drawn with "
             f"replacement {resamples} times, the same draw for both methods (paired), and the interval holds the "
             "central 95% of the resampled mean differences (percentile bootstrap). It covers the sampling of the "
             "sentences, not the seeds (their std is in the tables above).", ""]
    paragraph = versus_paragraph(results)
    return lines + ([paragraph, ""] if paragraph else [])


def _misses_section(methods: Mapping[str, Any]) -> List[str]:
    names = [n for n in _mask_rows(methods) if methods[n].get("misses")]
    if not names:
        return []
    rows = []
    for name in names:
        misses, record = methods[name]["misses"], methods[name]
        rows.append([f"`{name}`", fmt(misses["optimal"], 1)] + [fmt(misses[key], 1) for key in MISS_LABELS]
                    + [f"{misses['extra_tokens']:+.2f}", fmt(record.get("constraint_met"), 1), fmt(record.get("kl_mean"), 3),
                       fmt(record.get("step_mean"), 0)])
    headers = (["method", "optimal"] + list(MISS_LABELS.values())
               + ["kept − optimal size (tokens)", "own constraint met", "mean divergence (nats)", "mean step of the mask"])
    return ["## Where the per-example masks miss the optimum", "", table(headers, rows), "",
            "In percent of the scored sentences (means over the seeds), each sentence in exactly one of the first five "
            "columns. 'Own constraint met': the share of sentences whose returned mask meets the constraint the method "
            "optimises (its row label says which), with the mean of that divergence; the step the mask comes from "
            "(the last step unless a selection rule picked an earlier one; 0: every token kept, the start).", ""]


def _top_k_section(methods: Mapping[str, Any]) -> List[str]:
    rows = []
    for name, record in methods.items():
        if name == "ExactErasure":
            continue
        if record.get("selection") == "mask":
            rows.append([f"`{name}` (its keep probabilities)", fmt(record.get("topk_precision"), 2),
                         fmt(record.get("topk_recall"), 2), fmt(record.get("topk_f1"), 2),
                         fmt(record.get("topk_sufficiency"), 2)])
        else:
            rows.append([f"`{name}`{_probe_verdict(record)}", _cell(record, "precision"), _cell(record, "recall"),
                         _cell(record, "f1"), _cell(record, "sufficiency")])
    optimal_l0 = next((r.get("optimal_l0") for r in methods.values() if r.get("optimal_l0") is not None), None)
    return _own_output_section(methods) + [
            "## Every method: its top-k tokens, k = the optimal size (given the optimum's size)", "",
            table(["method", "precision", "recall", "F1", "sufficiency (= optimality)"], rows), "",
            "Each method ranks the tokens of a sentence; its k best tokens are kept and the rest replaced by the "
            "baseline. **These rows are given the optimum's size**, which no method has in a user's hands: they "
            "measure the ranking alone. Sufficiency: the share of sentences whose top-k tokens keep the predicted "
            "class; as k is the optimal size, such a set is itself optimal, so optimality equals sufficiency here. "
            f"L0 is the optimum's ({fmt(optimal_l0, 2)}%).", ""]


def _probe_verdict(record: Mapping[str, Any]) -> str:
    r"""An amortised fit's verdict on its probe, for the row's label ("" for a
    method without one): no conclusion rests on a probe the fit did not call
    converged."""
    last = record.get("fit_last")
    if not isinstance(last, Mapping) or "converged" not in last:
        return ""
    return " (probe converged)" if last["converged"] else f" (probe **not converged**: {last.get('status', 'n/a')})"


def _own_output_section(methods: Mapping[str, Any]) -> List[str]:
    rows = [[f"`{name}` (kept: P(kept) > 0.5){_probe_verdict(record)}"] + [fmt(record["own"].get(key), 2)
                                                                          for key in SCORE_KEYS]
            for name, record in methods.items() if record.get("status") == "ok" and record.get("own")]
    if not rows:
        return []
    return ["## The other methods' own masks", "",
            table(["method"] + [m["label"] for m in METRICS], rows), "",
            "A method whose scores are the probabilities that tokens are kept has a mask of its own: the tokens "
            "above 0.5, with no size given. Scored as the per-example masks are; the methods whose scores are "
            "not probabilities (gradients, occlusion drops, noise scales) have no mask of their own and appear "
            "only in the top-k table below.", ""]


def _all_solved_section(methods: Mapping[str, Any]) -> List[str]:
    solved_rows = [[f"`{n}`{_probe_verdict(r)}"] + [fmt(r["all_solved"].get(key), 2) for key in SCORE_KEYS]
                   for n, r in methods.items() if r.get("status") == "ok" and r.get("all_solved")]
    if not solved_rows:
        return []
    count = next(r["all_solved"]["count"] for r in methods.values() if r.get("all_solved"))
    return ["## All solved sentences, empty optima included", "",
            table(["method"] + [m["label"] for m in METRICS], solved_rows), "",
            f"The same scores over all {count} solved sentences, those whose optimal set is empty included "
            "(the prediction is the one the model makes with every token erased). There an empty kept set is exact "
            "(precision = recall = F1 = 100) and any kept token counts against precision; the top-k methods keep "
            "no token there by construction. The paper does not say how it treated such sentences.", ""]


def _speed_section(methods: Mapping[str, Any]) -> List[str]:
    rows = []
    for name, record in methods.items():
        if record.get("status") != "ok":
            rows.append([f"`{name}`", record.get("status", "failed"), ""])
            continue
        rows.append([f"`{name}`", fmt_seconds(record.get("seconds_per_example")), fmt_seconds(record.get("setup_seconds"))])
    return ["## Speed", "", table(["method", "seconds per sentence", "setup (once)"], rows), "",
            "Wall time of each method over the scored sentences (chunks of sentences of similar length, batched), "
            "divided by their number; exact erasure's over every searched sentence. Setup: amortised DiffMask's fit "
            "on train, the bottleneck's statistics.", ""]


def _erasure_section(results: Mapping[str, Any]) -> List[str]:
    erasure = results.get("erasure", {})
    model = results.get("model", {})
    if not erasure:
        return []
    unit = "word pieces" if erasure.get("unit") == "piece" else "words"
    sizes = sorted(erasure.get("size_histogram", {}).items(), key=lambda kv: int(kv[0]))
    solved = max(int(erasure.get("solved", 0)), 1)
    histogram = ", ".join(f"{k}: {v} ({100 * v / solved:.1f}%)" for k, v in sizes)
    return ["## Exact erasure, its optima and the model", "",
            table(["", ""], [
                ["sentences of the split", erasure.get("split_sentences")],
                [f"with <= {erasure.get('max_tokens')} {unit} (the cut)",
                 f"{erasure.get('within_cut')} ({fmt(erasure.get('within_cut_share'), 1)}% of the split)"],
                ["searched", erasure.get("sentences")],
                ["solved / not solved within the budget", f"{erasure.get('solved')} / {erasure.get('not_solved')}"],
                ["solved but the minimal size not fully enumerated", erasure.get("incomplete")],
                ["empty optimal set (left out)", f"{erasure.get('empty_optimum')} ({fmt(100 * erasure.get('empty_optimum', 0) / solved, 1)}% of the solved)"],
                ["scored", erasure.get("scored")],
                ["optimal size: solved sentences per size (tokens)", histogram],
                ["optimal size, mean / median (scored)", f"{fmt(erasure.get('mean_optimal_size'), 2)} / {fmt(erasure.get('median_optimal_size'), 0)}"],
                ["optimal share of the tokens (scored; the paper gives its masks' L0, 31-33%, not its optima's)", f"{fmt(erasure.get('optimal_share'), 2)}%"],
                [f"mean {unit} per scored sentence", fmt(erasure.get("mean_tokens"), 1)],
                ["mean number of optimal sets (scored)", fmt(erasure.get("mean_solutions"), 2)],
                ["model evaluations per sentence (mean / max)", f"{fmt(erasure.get('evaluations_mean'), 1)} / {erasure.get('evaluations_max')}"],
                ["GRU dev accuracy" + (" (model selection)" if gru_selected_on_dev(results.get("config", {}))
                                       else " (the last epoch's)"), fmt(100 * model.get("dev_accuracy", math.nan), 2) + "%"],
                ["GRU", f"one GRU layer of {model.get('hidden_size')} over frozen {model.get('embeddings')} vectors of "
                        f"{unit} ({model.get('embedding_dim')}-d, {model.get('vocabulary')} rows), trained on "
                        + (f"{model.get('train_examples')} train phrases" if model.get("phrases") else "the train sentences")],
                ["baseline (what an erased token becomes)", results.get("baseline", {}).get("kind", "")],
            ] + _peakedness_rows(model)), ""]


def _peakedness_rows(model: Mapping[str, Any]) -> List[List[str]]:
    peaked = model.get("peakedness_searched")
    if not peaked:
        return []
    return [["GRU on the searched sentences: mean probability of the predicted class",
             fmt(100 * peaked["max_probability"], 1) + "%"],
            ["... mean margin over the runner-up class", fmt(100 * peaked["margin"], 1) + " points"],
            ["... sentences whose predicted class has probability > 0.5", fmt(100 * peaked["over_half"], 1) + "%"]]


def _failures_section(methods: Mapping[str, Any]) -> List[str]:
    failed = [(n, r) for n, r in methods.items() if r.get("error")]
    if not failed:
        return []
    return (["## Methods that failed or are not available", ""]
            + [f"- `{n}` ({r.get('status')}): {r['error']}" for n, r in failed] + [""])


def _closing_sections(results: Mapping[str, Any], json_name: str) -> List[str]:
    env = results.get("environment", {})
    lines = chosen_on_section(results) + configuration_section(results.get("config", {}))
    if env:
        lines += environment_section(env)
    return lines + ["## Reproduce", "", "```bash", reproduce_command(results), "```", "",
                    f"All numbers are also in `{json_name}`. The trained GRU is cached in `~/.cache/captum_diffmask` "
                    "(or `$CAPTUM_DIFFMASK_CACHE`) and reused while the configuration and data are unchanged.", ""]
