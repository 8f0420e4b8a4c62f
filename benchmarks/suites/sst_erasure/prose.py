"""The sst-erasure suite's sentences: the row labels, the notes of a run, and
the paragraph that says where per-example DiffMask stands against REINFORCE,
every number taken from the run's results."""

from __future__ import annotations

import json
import math
from typing import Any, List, Mapping, Optional

from benchmarks.suites.sst_erasure.settings import gru_selected_on_dev, MASK_METHODS

#: What each mask row is, for the tables.
ROW_LABELS = {
    "PerExampleDiffMask": "per-example DiffMask",
    "REINFORCE": "REINFORCE, the authors' reward",
    "REINFORCE-corrected": "REINFORCE, corrected: the Lagrangian reward",
    "PerExampleDiffMask-oracle": "per-example DiffMask",
    "REINFORCE-oracle": "REINFORCE, corrected",
}
#: How each miss of :func:`~.scoring.miss_breakdown` reads.
MISS_LABELS = {
    "smaller": "fewer tokens than the optimum (the class flips)",
    "optimal_size_flips": "the optimal number of tokens, the class flips",
    "larger_keeps": "more tokens than the optimum, the class kept",
    "larger_flips": "more tokens than the optimum, the class flips",
}


def constraint_text(options: Mapping[str, Any]) -> str:
    r"""A mask row's own constraint, as the report writes it."""
    if options.get("divergence", "kl") == "prediction":
        return "log-loss of the predicted class against its strongest rival <= eps"
    return "KL <= eps"


def row_label(name: str, record: Mapping[str, Any]) -> str:
    r"""A mask row's label: what it runs and how its mask is chosen (an
    oracle-selected row says so)."""
    options = record.get("options", {})
    select = options.get("select", "last")
    how = {"last": "the last step's mask", "feasible": f"the sparsest mask within its {constraint_text(options)}",
           "sparsest": "**oracle-selected**: the sparsest mask that keeps the class"}.get(select, select)
    return f"`{name}` ({ROW_LABELS.get(name, name)}; {how})"


def summary_notes(results: Mapping[str, Any], config: Mapping[str, Any]) -> List[str]:
    r"""The notes of a run: the GRU, the cut, what exact erasure solved, the
    mask rows on the sentences with an empty optimum, the seeds, quick mode."""
    model, erasure = results["model"], results["erasure"]
    epochs = len(model["history"])
    selection = (f"the best of {epochs} epochs on dev" if gru_selected_on_dev(config)
                 else f"the last of {epochs} epochs, a rule fixed in advance")
    trained_on = (f"every phrase of the train trees ({model['train_examples']} distinct phrases)" if model.get("phrases")
                  else f"the {model['train_sentences']} train sentences")
    notes = [
        f"GRU classifier: dev accuracy {100 * model['dev_accuracy']:.2f}% (5 classes, {selection}), trained on {trained_on}, over frozen {model['embeddings']} vectors "
        f"of {'word pieces' if model['unit'] == 'piece' else 'words'}; {100 * model[results['split'] + '_accuracy_evaluated']:.2f}% on all of "
        f"{results['split']}.",
        f"The cut: {erasure['within_cut']} of the {erasure['split_sentences']} {results['split']} sentences "
        f"({erasure['within_cut_share']:.1f}%) have at most {erasure['max_tokens']} {_unit(erasure)} (the paper: "
        f"sentences of up to 25 tokens, 54% of the data).",
        f"Exact erasure: {erasure['solved']} of {erasure['sentences']} sentences solved within {erasure['budget']} "
        f"evaluations each ({erasure['not_solved']} not solved, left out); {erasure['empty_optimum']} have an empty "
        "optimal set (the prediction is what the model says with every token erased) and are left out of the scores"
        + (" (include_empty_optimum=True keeps them)" if not config.get("include_empty_optimum") else "")
        + f"; {erasure['scored']} sentences scored, mean optimal size {erasure['mean_optimal_size']:.2f} tokens of "
        f"{erasure['mean_tokens']:.1f}, {erasure['mean_solutions']:.2f} optimal sets each on average.",
    ]
    parts = [f"{n} keeps no token on {r['empty_optimum']['keeps_nothing']:.1f}% of them (L0 {r['empty_optimum']['l0']:.1f}%)"
             for n, r in results["methods"].items() if n in MASK_METHODS and r.get("empty_optimum")]
    if parts:
        notes.append(f"On the {erasure['empty_optimum']} sentences with an empty optimum, the per-example masks: "
                     + "; ".join(parts) + ". The scores over all solved sentences, "
                     "these included (an empty kept set is then exact), are in the table 'All solved sentences'.")
    if len(config.get("seeds", [])) > 1:
        seeds = ", ".join(str(s) for s in config["seeds"])
        notes.append(f"Seeds {seeds}: the GRU is trained with the first ({config['seeds'][0]}); the per-example masks "
                     "run once per seed and their scores are the means over the seeds (each seed's in the table "
                     "'Per-example masks, seed by seed'); their top-k scores, kept tokens in the figure and "
                     "empty-optimum scores are the first seed's; every other method runs once, with the first seed.")
    if config.get("quick"):
        notes.append("Quick mode: a subset of the split, a shorter GRU training and fewer optimisation steps; "
                     "the targets are for the full run on dev.")
    return notes


def _unit(erasure: Mapping[str, Any]) -> str:
    return "word pieces ([CLS] and [SEP] included)" if erasure.get("unit") == "piece" else "words"


def _verdict(ci: Mapping[str, float]) -> str:
    if ci["low"] > 0:
        return "ahead"
    if ci["high"] < 0:
        return "behind"
    return "level within the sentences' noise (the interval holds 0)"


def versus_paragraph(results: Mapping[str, Any], first: str = "PerExampleDiffMask") -> Optional[str]:
    r"""
    Where ``first`` stands against each REINFORCE row it is compared with, and
    why: the miss that separates them most, how early the masks were taken,
    and what the rows' own constraint lets through. One paragraph from the
    run's numbers, or None when no comparison ran.
    """
    methods = results.get("methods", {})
    comparisons = [c for c in results.get("comparisons", []) if c["first"] == first]
    if not comparisons:
        return None
    mine = methods[first]
    parts = []
    for c in comparisons:
        other, metrics = methods[c["second"]], c["metrics"]
        f1, opt, l0 = metrics["f1"], metrics["optimality"], metrics["l0"]
        more = "more" if l0["difference"] >= 0 else "fewer"
        parts.append(
            f"Against `{c['second']}` ({ROW_LABELS.get(c['second'], c['second'])}), `{first}` is "
            f"{_verdict(f1)} on F1 ({mine['f1']:.2f} vs {other['f1']:.2f}; {f1['difference']:+.2f}, 95% CI "
            f"[{f1['low']:+.2f}, {f1['high']:+.2f}]) and {_verdict(opt)} on optimality ({mine['optimality']:.2f} vs "
            f"{other['optimality']:.2f}%; {opt['difference']:+.2f} [{opt['low']:+.2f}, {opt['high']:+.2f}]), keeping "
            f"{abs(l0['difference']):.2f} points {more} of the tokens ([{l0['low']:+.2f}, {l0['high']:+.2f}]); "
            + _widest_miss(first, c["second"], methods) + "."
        )
    names = [first] + [c["second"] for c in comparisons]
    steps = ", ".join(f"`{n}` {methods[n].get('step_mean', float('nan')):.0f}" for n in names)
    flips = ", ".join(f"`{n}` {100.0 - methods[n]['sufficiency']:.1f}%" for n in names)
    met = min(methods[n].get("constraint_met", 0.0) for n in names)
    flip_keys = ("smaller", "optimal_size_flips", "larger_flips")
    commonest = {max(flip_keys, key=lambda k: methods[n].get("misses", {}).get(k, 0.0)) for n in names}
    how = f", most often with {MISS_LABELS[commonest.pop()].split(' (')[0]}" if len(commonest) == 1 else ""
    options = mine.get("options", {})
    keeps_class = options.get("divergence", "kl") == "prediction" and float(options.get("eps", 1.0)) < math.log(2)
    why = ("a mask that meets it gives the predicted class a probability above 1/2, so it keeps the class"
           if keeps_class else
           f"that constraint lets the class flip on some of them{how}: a KL of eps nats does not keep an argmax "
           "whose margin is small, and the erasure optimum is defined by the argmax")
    parts.append(
        f"Why: the mean step each row's mask comes from is {steps} (of {options.get('steps', 'n/a')}); every row's "
        f"mask meets its own {constraint_text(options)} on at least {met:.1f}% of the sentences, and {why} "
        f"(the class flips on {flips} of the sentences)."
    )
    return " ".join(parts)


def _widest_miss(first: str, second: str, methods: Mapping[str, Any]) -> str:
    r"""The miss on which two rows differ most, as a clause."""
    a, b = methods[first].get("misses", {}), methods[second].get("misses", {})
    key = max(MISS_LABELS, key=lambda k: abs(a.get(k, 0.0) - b.get(k, 0.0)))
    return (f"their masks differ most in {MISS_LABELS[key]}: {a.get(key, 0.0):.1f}% of the sentences for "
            f"`{first}` against {b.get(key, 0.0):.1f}%")


def budgets_paragraphs(results: Mapping[str, Any], first: str = "PerExampleDiffMask") -> List[str]:
    r"""
    The per-example rows' tuning budgets (``results["tuning"]``) and what the
    comparison under them says about the paper's claim that DiffMask's lead
    over REINFORCE comes from the relaxation. Empty when the run recorded no
    tuning.
    """
    tuning = results.get("tuning")
    if not tuning:
        return []
    rows = tuning["rows"]
    same = len({json.dumps([r["trials"], r["steps"], r["tried"].get("eps")]) for r in rows.values()}) == 1
    lines = [f"Every per-example row was tuned on the same {'/'.join(map(str, tuning['sentences']))} train sentences "
             f"(of {'/'.join(map(str, tuning['searched']))} searched; never the split this report scores), "
             + ("with the same budget: " if same else "with these budgets: ")
             + "; ".join(f"`{name}` {r['trials']} trials of {'/'.join(map(str, r['steps']))} steps over "
                         + ", ".join(f"{k} {{{', '.join(f'{v:g}' for v in values)}}}" for k, values in r["tried"].items())
                         for name, r in rows.items()) + ". Best train F1 per row at each shared value: "
             + "; ".join(f"`{name}` " + ", ".join(f"{shared}: {f1:.1f}" for shared, f1 in r["best_f1"].items())
                         for name, r in rows.items()) + "."]
    verdicts = {c["second"]: _verdict(c["metrics"]["f1"]) for c in results.get("comparisons", []) if c["first"] == first}
    if verdicts.get("REINFORCE") == "ahead" and verdicts.get("REINFORCE-corrected") == "behind":
        lines.append(f"What it says about the paper's claim: under equal budgets `{first}` is ahead of REINFORCE with "
                     "the authors' reward and behind REINFORCE with the Lagrangian reward, whose constraint and "
                     "multiplier are DiffMask's own. The paper explains DiffMask's lead by the relaxation (a "
                     "lower-variance gradient than REINFORCE's); here the lead comes from the reward, and the "
                     "relaxation alone does not beat a score-function estimator given the same objective.")
    elif verdicts:
        lines.append(f"What it says about the paper's claim: under equal budgets `{first}` is "
                     + "; ".join(f"{v} of `{name}` on F1" for name, v in verdicts.items()) + ".")
    return lines
