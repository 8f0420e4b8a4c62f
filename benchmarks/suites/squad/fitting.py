"""The squad suite's DiffMask: fitted on windows of the fine-tuning articles
(the sst suite's fit, with this task's settings), its keep probabilities on the
analysed windows, and the answers of the model under its gates."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from captum_diffmask import DiffMask
from captum_diffmask.model.forward import model_device
from benchmarks.tasks.squad import best_spans, span_text, squad_scores
from benchmarks.tasks.squad import window_batches

from benchmarks.progress import bar, log_to_stderr
from benchmarks.runner import merge
from benchmarks.common.minilm.attributions import per_sentence
from benchmarks.common.minilm.fit_cache import cached_fit
from benchmarks.common.minilm.fitting import fit_diffmask
from benchmarks.suites.squad.loading import Bench


def fit_mode(config: Mapping[str, Any], bench: Bench, mode: str, seed: int, verbose: bool) -> Tuple[DiffMask, Dict[str, Any]]:
    r"""
    DiffMask in ``mode`` fitted on ``bench.train`` and validated on
    ``bench.valid`` (:func:`benchmarks.common.minilm.fitting.fit_diffmask`), with
    ``config["diffmask"]``'s settings, through the fit cache
    (:func:`benchmarks.common.minilm.fit_cache.cached_fit`: a stored fit is
    loaded; a fit stopped by its cap or killed goes on from its state, so a
    long fit can span invocations, e.g. two calls on a lent GPU).

    Returns:
        *tuple* ``(explainer, record)``: the record as the sst suite's (history,
        seconds, selected epoch, options, per-layer convergence) plus
        ``window_steps`` (windows seen in training).
    """
    options = {k: v for k, v in config["diffmask"].items() if k != "validation_windows"}
    log_to_stderr(verbose, f"[squad] DiffMask {mode}, seed {seed}")
    explainer, record = cached_fit(fit_diffmask, bench.model, mode, bench.train, bench.valid,
                                   {"diffmask": options, "cache": config.get("cache", True)}, seed, verbose)
    record["window_steps"] = fit_batches(record) * int(options.get("batch_size", 64))
    return explainer, record


def fit_batches(record: Mapping[str, Any]) -> int:
    r"""The optimiser steps (batches) of a fit: with every layer trained on each
    batch, the steps of its longest-training layer (a sum over the layers would
    count a batch once per layer); with one layer drawn per batch, the sum."""
    steps = [int(report["steps"]) for report in record["convergence"].values()]
    return sum(steps) if record.get("layers_per_batch") == 1 and len(steps) > 1 else max(steps)


def paper_recipe_config(config: Mapping[str, Any], bench: Bench, mode: str) -> Tuple[Dict[str, Any], int]:
    r"""
    The suite's configuration with ``config["paper_recipe"]``'s DiffMask
    settings for ``mode`` (its epochs included), and the recipe's seed.

    Returns:
        *tuple* ``(config, seed)``, the config for :func:`fit_mode`.
    """
    recipe = config["paper_recipe"]
    # one layer drawn per batch: (layers + 1) epochs give each input depth about one
    epochs = {"input": int(recipe["input_epochs_per_layer"]) * (bench.layers + 1), "hidden": int(recipe["hidden_epochs"])}
    settings = merge(recipe["diffmask"], {mode: {"epochs": epochs[mode]}})
    settings["validation_windows"] = config["diffmask"].get("validation_windows")
    return {**config, "diffmask": settings}, int(recipe.get("seeds", config["seeds"])[0])


def fit_paper_recipe(config: Mapping[str, Any], bench: Bench, verbose: bool) -> Optional[Dict[str, Any]]:
    r"""
    The paper's QA recipe (``config["paper_recipe"]``, :func:`paper_recipe_config`)
    fitted in both modes on the suite's windows (through the fit cache), its
    deterministic read-out scored on the held-out fine-tuning windows as the
    suite's fits are, and the model's answers under its gates on the analysed
    questions.

    Returns:
        *dict* ``{"seed", "epochs": {mode: epochs}, "diffmask": {mode: the
        fit's record (as :func:`fit_mode`'s) with "agreement" (as
        :func:`agreement`'s)}}``, or None when the recipe is left out.
    """
    if not config.get("paper_recipe"):
        return None
    original = {q: bench.answers[q] for q in bench.questions}
    result: Dict[str, Any] = {"epochs": {}, "diffmask": {}}
    for mode in ("input", "hidden"):
        recipe_config, result["seed"] = paper_recipe_config(config, bench, mode)
        result["epochs"][mode] = recipe_config["diffmask"][mode]["epochs"]
        log_to_stderr(verbose, f"[squad] the paper's recipe, {mode}, {result['epochs'][mode]} epochs")
        explainer, record = fit_mode(recipe_config, bench, mode, result["seed"], verbose)
        record["agreement"] = agreement(bench, masked_answers(explainer, bench, 16, verbose), original)
        result["diffmask"][mode] = record
    return result


def keep_probabilities(explainer: DiffMask, bench: Bench, verbose: bool) -> List[Tensor]:
    r"""Per analysed window, its (T, L + 1) keep probabilities at every layer
    (real tokens only), in row order."""
    return per_sentence(
        bench.windows, 16,
        lambda ids, mask, types: explainer.attribute(ids, additional_forward_args=(mask, types), layer=None),
        verbose, f"attribute {explainer.mode}", device=model_device(explainer.model), extra=("token_type_ids",))


def masked_answers(explainer: DiffMask, bench: Bench, batch_size: int, verbose: bool) -> Dict[int, Dict[str, Any]]:
    r"""
    Per layer k, the model's answers under DiffMask's deterministic gates read
    at k (actual erasure: gated-off inputs or states replaced by the learned
    baseline), on every analysed question.

    Args:

        explainer (DiffMask): fitted.
        bench (Bench): the analysed windows and the unmasked answers.
        batch_size (int): windows per forward pass.
        verbose (bool): a progress bar.

    Returns:
        *dict* ``{k: {"answers": {question: text}, "kept": (N,) kept real
        positions per window}}``.
    """
    windows, layers = bench.windows, list(range(explainer.num_layers + 1))
    low = torch.finfo(torch.float32).min
    logits = {k: torch.full((2, *windows.input_ids.shape), low) for k in layers}
    kept = {k: torch.zeros(len(windows)) for k in layers}
    batches = list(window_batches(windows, batch_size))
    device = model_device(explainer.model)
    for rows, *batch in bar(batches, verbose, desc=f"masked answers {explainer.mode}"):
        ids, mask, types = (t.to(device) for t in batch[:3])
        for k, (gates, masked, _) in explainer.masked_forward_layers(ids, (mask, types), layers).items():
            logits[k][:, rows, : ids.shape[1]] = masked.detach().float().transpose(0, 1).cpu()
            kept[k][rows] = (gates > 0).float().sum(1).cpu()
    result = {}
    for k in layers:
        spans = best_spans(windows, logits[k][0], logits[k][1], len(bench.held_out))
        answers = {q: span_text(bench.held_out[q], windows, spans[q]) for q in bench.questions}
        result[k] = {"answers": answers, "kept": kept[k]}
    return result


def agreement(bench: Bench, masked: Mapping[int, Mapping[str, Any]], original: Mapping[int, str]) -> List[Dict[str, Any]]:
    r"""
    Per layer: the official exact match and F1 of the masked answers against
    the model's own (unmasked) answers and against the gold answers, the share
    of real positions masked, and the same agreement on the questions with more
    than 95 % of their positions masked.

    Args:

        bench (Bench): the analysed windows and questions.
        masked (Mapping): :func:`masked_answers`' result.
        original (Mapping): the unmasked answer per analysed question.

    Returns:
        *list* of one dict per layer.
    """
    lengths = bench.windows.attention_mask.sum(1).float()
    owner = bench.windows.example_index
    rows = []
    for k, entry in sorted(masked.items()):
        per_question = {q: 1.0 - float(entry["kept"][owner == q].sum() / lengths[owner == q].sum()) for q in bench.questions}
        against_own = [dataclasses.replace(bench.held_out[q], answers=(original[q],), answer_starts=(0,)) for q in bench.questions]
        predictions = {bench.held_out[q].id: entry["answers"][q] for q in bench.questions}
        same = squad_scores(predictions, against_own)
        gold = squad_scores(predictions, [bench.held_out[q] for q in bench.questions])
        sparse = [e for e, q in zip(against_own, bench.questions) if per_question[q] > 0.95]
        sparse_same = squad_scores(predictions, sparse)["exact_match"] if sparse else float("nan")
        rows.append({"layer": k, "masked_share": 100.0 * (1.0 - float(entry["kept"].sum() / lengths.sum())),
                     "same_exact_match": same["exact_match"], "same_f1": same["f1"],
                     "gold_exact_match": gold["exact_match"], "gold_f1": gold["f1"],
                     "over_95_questions": len(sparse), "over_95_same_exact_match": sparse_same})
    return rows
