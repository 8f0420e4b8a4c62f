"""The sst-erasure suite's prose: the notes of a run and the markdown report,
one function per table."""

from __future__ import annotations

import math
import os
from typing import Any, List, Mapping

from ...report import (
    checks_section,
    configuration_section,
    environment_section,
    fmt,
    fmt_seconds,
    notes_section,
    reproduce_command,
    run_line,
    table,
)
from .settings import DESCRIPTION, MASK_METHODS, METRICS, PAPER, SCORE_KEYS


def summary_notes(results: Mapping[str, Any], config: Mapping[str, Any]) -> List[str]:
    r"""The notes of a run: the GRU, what exact erasure solved, the per-example
    masks on the sentences with an empty optimum, the seeds, quick mode."""
    notes: List[str] = []
    model, erasure = results["model"], results["erasure"]
    selection = "the best of" if config["model"].get("select", "best") == "best" else "the last of"
    notes.append(
        f"GRU classifier: dev accuracy {100 * model['dev_accuracy']:.2f}% (5 classes, {selection} "
        f"{len(model['history'])} epochs on dev, words unseen in train as <unk>); "
        f"{100 * model[results['split'] + '_accuracy_evaluated']:.2f}% on {results['split']} with those words' own "
        f"frozen vectors ({model.get('extended_words', 0)} words added). The paper does not give its GRU's accuracy."
    )
    notes.append(
        f"Exact erasure: {erasure['solved']} of {erasure['sentences']} sentences solved within {erasure['budget']} "
        f"evaluations each ({erasure['not_solved']} not solved, left out); {erasure['empty_optimum']} have an empty "
        "optimal set (the prediction is what the model says with every word erased) and are left out of the scores"
        + (" (include_empty_optimum=True keeps them)" if not config.get("include_empty_optimum") else "")
        + f"; {erasure['scored']} sentences scored, mean optimal size {erasure['mean_optimal_size']:.2f} words of "
        f"{erasure['mean_words']:.1f}, {erasure['mean_solutions']:.2f} optimal sets each on average."
    )
    parts = [f"{n} keeps no word on {r['empty_optimum']['keeps_nothing']:.1f}% of them (L0 {r['empty_optimum']['l0']:.1f}%)"
             for n, r in results["methods"].items() if n in MASK_METHODS and r.get("empty_optimum")]
    if parts:
        notes.append(f"On the {erasure['empty_optimum']} sentences with an empty optimum, the per-example masks (trained "
                     "for KL <= eps, not for the class): " + "; ".join(parts) + ". The scores over all solved sentences, "
                     "these included (an empty kept set is then exact), are in the last table.")
    if len(config.get("seeds", [])) > 1:
        seeds = ", ".join(str(s) for s in config["seeds"])
        notes.append(f"Seeds {seeds}: the GRU is trained with the first ({config['seeds'][0]}); the per-example masks "
                     f"({', '.join(MASK_METHODS)}) run once per seed and their scores are the means over the seeds "
                     "(each seed's in the table 'Per-example masks, seed by seed'); their top-k scores, kept words in "
                     "the figure and empty-optimum scores are the first seed's; every other method runs once, with "
                     "the first seed.")
    if config.get("quick"):
        notes.append("Quick mode: a subset of the split, a shorter GRU training and fewer optimisation steps; "
                     "the targets are for the full run on dev.")
    return notes


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
    lines += _seeds_section(methods)
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


def _table2_section(results: Mapping[str, Any]) -> List[str]:
    methods = results.get("methods", {})
    paper = results.get("paper", PAPER)
    rows = []
    for name in MASK_METHODS:
        if name not in methods:
            continue
        record = methods[name]
        row: List[Any] = [f"`{name}`"]
        for key in ("precision", "recall", "f1", "optimality", "l0"):
            row += [_cell(record, key), fmt(paper.get(name, {}).get(key), 2)]
        row.append(_cell(record, "sufficiency"))
        rows.append(row)
    headers = ["method"]
    for key in ("precision", "recall", "F1", "optimality", "L0"):
        headers += [f"{key}, ours", f"{key}, paper"]
    headers.append("sufficiency, ours")
    lines = ["## Per-example masks against exact erasure (the paper's Table 2)", "", table(headers, rows), "",
             "All in percent, each the mean over scored sentences of a per-sentence value. Precision, recall and F1 "
             "of the words the deterministic mask keeps (gate open with probability > 0.5) against the optimal set "
             "closest to them; optimality: the mask keeps the predicted class with exactly the optimal number of "
             "words; L0: share of words kept; sufficiency: the mask keeps the predicted class.", ""]
    if results.get("paper_source"):
        lines += [f"Paper: {results['paper_source']}", ""]
    return lines


def _seeds_section(methods: Mapping[str, Any]) -> List[str]:
    seed_rows = [[f"`{name}`", str(row["seed"])] + [fmt(row[key], 2) for key in SCORE_KEYS]
                 for name in MASK_METHODS for row in methods.get(name, {}).get("per_seed", [])]
    seed_rows += [[f"`{name}`", "std"] + [fmt(methods[name]["std_over_seeds"][key], 2) for key in SCORE_KEYS]
                  for name in MASK_METHODS if methods.get(name, {}).get("std_over_seeds")]
    if not seed_rows:
        return []
    return ["## Per-example masks, seed by seed", "",
            table(["method", "seed", "precision", "recall", "F1", "optimality", "L0", "sufficiency"], seed_rows), "",
            "The table above gives the means over these seeds; std: the standard deviation over them.", ""]


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
            rows.append([f"`{name}`", _cell(record, "precision"), _cell(record, "recall"), _cell(record, "f1"),
                         _cell(record, "sufficiency")])
    optimal_l0 = next((r.get("optimal_l0") for r in methods.values() if r.get("optimal_l0") is not None), None)
    return ["## Every method: its top-k words, k = the optimal size", "",
            table(["method", "precision", "recall", "F1", "sufficiency (= optimality)"], rows), "",
            "Each method ranks the words of a sentence; its k best words are kept and the rest replaced by the "
            "baseline. Sufficiency: the share of sentences whose top-k words keep the predicted class; as k is the "
            "optimal size, such a set is itself optimal, so optimality equals sufficiency here. L0 is the optimum's "
            f"({fmt(optimal_l0, 2)}%).", ""]


def _all_solved_section(methods: Mapping[str, Any]) -> List[str]:
    solved_rows = [[f"`{n}`"] + [fmt(r["all_solved"].get(key), 2) for key in SCORE_KEYS]
                   for n, r in methods.items() if r.get("status") == "ok" and r.get("all_solved")]
    if not solved_rows:
        return []
    count = next(r["all_solved"]["count"] for r in methods.values() if r.get("all_solved"))
    return ["## All solved sentences, empty optima included", "",
            table(["method"] + [m["label"] for m in METRICS], solved_rows), "",
            f"The same scores over all {count} solved sentences, those whose optimal set is empty included "
            "(the prediction is the one the model makes with every word erased). There an empty kept set is exact "
            "(precision = recall = F1 = 100) and any kept word counts against precision; the top-k methods keep "
            "no word there by construction. The paper does not say how it treated such sentences.", ""]


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
    histogram = ", ".join(f"{k}: {v}" for k, v in sorted(erasure.get("size_histogram", {}).items(), key=lambda kv: int(kv[0])))
    return ["## Exact erasure and the model", "",
            table(["", ""], [
                ["sentences of the split", erasure.get("split_sentences")],
                ["with <= max_words words (searched)", erasure.get("sentences")],
                ["solved / not solved within the budget", f"{erasure.get('solved')} / {erasure.get('not_solved')}"],
                ["solved but the minimal size not fully enumerated", erasure.get("incomplete")],
                ["empty optimal set (left out)", erasure.get("empty_optimum")],
                ["scored", erasure.get("scored")],
                ["optimal size: sentences per size", histogram],
                ["mean optimal size / mean words (scored)", f"{fmt(erasure.get('mean_optimal_size'), 2)} / {fmt(erasure.get('mean_words'), 1)}"],
                ["mean number of optimal sets (scored)", fmt(erasure.get("mean_solutions"), 2)],
                ["model evaluations per sentence (mean / max)", f"{fmt(erasure.get('evaluations_mean'), 1)} / {erasure.get('evaluations_max')}"],
                ["GRU dev accuracy (model selection)", fmt(100 * model.get("dev_accuracy", math.nan), 2) + "%"],
                ["GRU", f"{model.get('embeddings')} word vectors ({model.get('embedding_dim')}-d, frozen), hidden {model.get('hidden_size')}, vocabulary {model.get('vocabulary')} (train)"],
                ["baseline", results.get("baseline", {}).get("kind", "")],
            ]), ""]


def _failures_section(methods: Mapping[str, Any]) -> List[str]:
    failed = [(n, r) for n, r in methods.items() if r.get("error")]
    if not failed:
        return []
    return (["## Methods that failed or are not available", ""]
            + [f"- `{n}` ({r.get('status')}): {r['error']}" for n, r in failed] + [""])


def _closing_sections(results: Mapping[str, Any], json_name: str) -> List[str]:
    env = results.get("environment", {})
    lines = configuration_section(results.get("config", {}))
    if env:
        lines += environment_section(env)
    return lines + ["## Reproduce", "", "```bash", reproduce_command(results), "```", "",
                    f"All numbers are also in `{json_name}`. The trained GRU is cached in `~/.cache/captum_diffmask` "
                    "(or `$CAPTUM_DIFFMASK_CACHE`) and reused while the configuration and data are unchanged.", ""]
