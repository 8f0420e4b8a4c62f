"""The squad suite's run: the model and its answers, DiffMask in both modes,
the keep of every token group per layer, the masked model's answers, the gold
answer of wrong answers, parts of speech, the five observations, the figures,
the methods side by side, speed, and the results."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from torch import Tensor

from captum_diffmask import DiffMask
from benchmarks.tasks.squad import squad_scores
from benchmarks.tasks.sst_bert import character_pos_tags

from benchmarks.progress import log_to_stderr
from benchmarks.records import cached
from benchmarks.tasks.squad import SquadExample
from benchmarks.suites.squad import analysis
from benchmarks.suites.squad.figures import heatmap_figures, keep_figure, pos_figure, side_by_side_figures
from benchmarks.suites.squad.fitting import agreement, fit_mode, fit_paper_recipe, keep_probabilities, masked_answers
from benchmarks.suites.squad.loading import Bench, load_bench
from benchmarks.suites.squad.observations import MIN_POS_TOKENS, observations
from benchmarks.suites.squad.side_by_side import run_side_by_side, select_examples
from benchmarks.suites.squad.speed import measure_speed

MODES = ("input", "hidden")


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""Runs the squad suite with ``config`` (see :data:`DEFAULTS`); figures go
    to ``out_dir / "figures"``."""
    seed = int(config["seeds"][0])
    notes: List[str] = []
    figures_dir = out_dir / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    lap = _Laps(verbose)
    load = {"start": os.getloadavg()}  # other processes on the machine slow the wall time
    bench = lap("model, answers and windows", load_bench(config, verbose))
    explainers, fits, keep, answers_masked = fit_and_read(config, bench, seed, verbose, lap)
    paper = lap("the paper's recipe", fit_paper_recipe(config, bench, verbose))
    scores = lap("analysis (groups, POS)", analyse(config, bench, keep, answers_masked, notes))
    shown = select_examples(bench, int(config["side_by_side"]["examples"]), int(config["side_by_side"]["max_tokens"]))
    if not shown:
        notes.append("No analysed question fits one window of at most side_by_side.max_tokens tokens: "
                     "no heatmaps and no side-by-side figure.")
    width = int(config.get("heatmap_max_tokens", 48))
    compared = run_side_by_side(config, bench, explainers["input"], shown, seed, verbose) if shown else {"records": {}}
    lap("methods side by side", None)
    figures = {"keep": keep_figure(scores["keep"], scores["agreement"], figures_dir / "squad_keep.png"),
               "heatmaps": heatmap_figures(bench, shown[: int(config.get("heatmap_examples", 3))], keep, width, figures_dir),
               "side_by_side": side_by_side_figures(bench, shown, compared.get("scores", {}), width, figures_dir)}
    if scores["pos"]:
        figures["pos"] = pos_figure(scores["pos"], bench.layers, figures_dir / "squad_pos.png", MIN_POS_TOKENS)
    lap("figures", None)
    speed = lap("speed", measure_speed(config, bench, explainers, fits, verbose))
    load["end"] = os.getloadavg()
    return {
        "title": f"SQuAD v1.1 with {bench.model_info['source']} ({bench.layers} layers): DiffMask on inputs and hidden states",
        "seeds": [seed], "model": bench.model_info, "diffmask": fits, **scores,
        "observations": observations(scores), "side_by_side": _side_by_side_record(bench, shown, compared),
        "speed": speed, "figures": figures, "notes": notes, "stages": lap.seconds, "paper_recipe": paper,
        "load_average": load,
    }


class _Laps:
    r"""The wall and CPU time (this process, every thread) of each stage of the
    run: ``lap(name, value)`` records the time since the previous lap under
    ``name`` (logged) and returns ``value``. On a shared machine the wall time
    also counts the other processes; the CPU time is the run's own work."""

    def __init__(self, verbose: bool) -> None:
        self.verbose, self.seconds = verbose, {}
        self.last = (time.perf_counter(), time.process_time())

    def __call__(self, name: str, value: Any) -> Any:
        now = (time.perf_counter(), time.process_time())
        wall, cpu = now[0] - self.last[0], now[1] - self.last[1]
        self.seconds[name] = {"wall": wall, "cpu": cpu}
        log_to_stderr(self.verbose, f"[squad] {name}: {wall:.0f} s ({cpu:.0f} s CPU)")
        self.last = now
        return value


def fit_and_read(
    config: Mapping[str, Any], bench: Bench, seed: int, verbose: bool, lap: Callable[[str, Any], Any]
) -> Tuple[Dict[str, DiffMask], Dict[str, Any], Dict[str, List[Tensor]], Dict[str, Any]]:
    r"""
    DiffMask fitted in each mode, its keep probabilities on the analysed windows
    and the model's answers under its gates at every layer.

    Returns:
        *tuple* ``(explainers, fits, keep, masked)`` per mode: the explainer,
        the fit's record, per window the (T, L + 1) keep probabilities, and
        :func:`masked_answers`' result.
    """
    explainers: Dict[str, DiffMask] = {}
    fits: Dict[str, Any] = {}
    keep: Dict[str, List[Tensor]] = {}
    masked: Dict[str, Any] = {}
    for mode in MODES:
        explainers[mode], fits[mode] = lap(f"DiffMask {mode}: fit", fit_mode(config, bench, mode, seed, verbose))
        keep[mode] = lap(f"DiffMask {mode}: keep probabilities", keep_probabilities(explainers[mode], bench, verbose))
        masked[mode] = lap(f"DiffMask {mode}: masked answers", masked_answers(explainers[mode], bench, 16, verbose))
    return explainers, fits, keep, masked


def analyse(config: Mapping[str, Any], bench: Bench, keep: Mapping[str, List[Tensor]], masked: Mapping[str, Any],
            notes: List[str]) -> Dict[str, Any]:
    r"""
    The results' numbers: per mode the keep of every token group per layer
    (``keep``), the masked model's answers (``agreement``), the gold answer's
    keep by correctness (``gold_when_wrong``) and by part of speech (``pos``,
    empty when the tagger is missing: ``notes`` says so); and ``questions``,
    the analysed questions' unmasked score.
    """
    groups = analysis.token_groups(bench.windows, bench.spans, bench.tokenizer.cls_token_id, bench.tokenizer.sep_token_id)
    original = {q: bench.answers[q] for q in bench.questions}
    analysed = [bench.held_out[q] for q in bench.questions]
    exact, f1 = _per_question_scores(bench)
    pos_groups = _pos_groups(config, bench, notes)
    owner = bench.windows.example_index
    return {
        "questions": squad_scores({e.id: bench.answers[q] for e, q in zip(analysed, bench.questions)}, analysed),
        "keep": {mode: analysis.keep_by_group(keep[mode], groups) for mode in MODES},
        "agreement": {mode: agreement(bench, masked[mode], original) for mode in MODES},
        "gold_when_wrong": {mode: analysis.gold_when_wrong(keep[mode], groups, owner, bench.questions, exact, f1)
                            for mode in MODES},
        "pos": {mode: analysis.keep_by_group(keep[mode], pos_groups) for mode in MODES} if pos_groups else {},
    }


def _per_question_scores(bench: Bench) -> Tuple[Dict[int, float], Dict[int, float]]:
    r"""Per analysed question, the model's exact match and F1 (0..1)."""
    exact, f1 = {}, {}
    for q in bench.questions:
        example = bench.held_out[q]
        score = squad_scores({example.id: bench.answers[q]}, [example])
        exact[q], f1[q] = score["exact_match"] / 100.0, score["f1"] / 100.0
    return exact, f1


def _pos_groups(config: Mapping[str, Any], bench: Bench, notes: List[str]) -> Optional[List[List[Set[str]]]]:
    r"""The part-of-speech groups of the analysed windows' tokens, or None
    (``pos`` False, or the tagger missing with ``pos`` "auto": a note)."""
    wanted = config.get("pos", "auto")
    if wanted is False:
        return None
    examples = [bench.held_out[q] for q in bench.windows.example_index.tolist()]
    try:
        tags = held_out_pos_tags(bench.held_out, bool(config.get("cache", True)))
    except ImportError as error:
        if wanted is True:
            raise
        notes.append(f"Part-of-speech groups skipped: {error}")
        return None
    return analysis.pos_token_groups(bench.windows, [tags[e.question.lstrip()] for e in examples],
                                     [tags[e.context] for e in examples])


def held_out_pos_tags(held_out: List[SquadExample], use_cache: bool = True) -> Dict[str, List[str]]:
    r"""
    The part of speech of every character of every held-out question and
    context (:func:`character_pos_tags`), cached by the questions' ids: a
    machine without spaCy (a GPU machine) reads the tags another one stored.

    Raises:
        ImportError: spaCy or its pipeline is missing and no tags are cached.
    """
    texts = sorted({e.question.lstrip() for e in held_out} | {e.context for e in held_out})

    def build() -> Dict[str, Any]:
        return {"tags": dict(zip(texts, character_pos_tags(texts)))}

    payload, _ = cached("squad-pos", {"held_out": [e.id for e in held_out]}, build, use_cache=use_cache)
    return payload["tags"]


def _side_by_side_record(bench: Bench, rows: List[int], compared: Mapping[str, Any]) -> Dict[str, Any]:
    r"""The results' ``side_by_side``: the examples shown and every method's record."""
    examples = []
    for row in rows:
        q = int(bench.windows.example_index[row])
        e = bench.held_out[q]
        examples.append({"id": e.id, "question": e.question, "gold": e.answers[0], "predicted": bench.answers[q],
                         "tokens": int(bench.windows.attention_mask[row].sum())})
    return {"examples": examples, "methods": compared.get("records", {})}
