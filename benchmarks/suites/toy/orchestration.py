"""The toy suite's run (:func:`run`): per seed, the data and the toy model, every
method set up and scored on the held-out set; on the first seed the speed of
every method against one forward pass and the figures."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch

from benchmarks.methods import MethodContext, prepare, PreparedMethod
from benchmarks.progress import bar, error_text, log
from benchmarks.records import median_seconds
from benchmarks.suites.toy.figures import make_figures
from benchmarks.suites.toy.prose import summary_notes
from benchmarks.suites.toy.scoring import aggregate, checks, load_toy_model, method_context, score, seed_data
from benchmarks.suites.toy.settings import METRICS, PAPER, PAPER_SOURCE
from captum_diffmask.evaluation.ground_truth import js_to_ground_truth, summarize
from captum_diffmask.evaluation.toy_task import toy_ground_truth, ToyData, ToyModel


def _attribute_all(
    prepared: PreparedMethod, data: ToyData, layer: int, chunk: int, seed: int, verbose: bool
) -> Tuple[torch.Tensor, float]:
    r"""(N, T) scores of every example of ``data``, in chunks, and the seconds spent."""
    torch.manual_seed(seed)
    pieces = []
    start = time.perf_counter()
    for begin in bar(range(0, len(data), chunk), verbose, desc=f"{prepared.name} attribute"):
        end = begin + chunk
        pieces.append(prepared.attribute(data.ids[begin:end], (data.query[begin:end], data.mask[begin:end]), layer))
    return torch.cat(pieces), time.perf_counter() - start


# -------------------------------------------------------------------- run
def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""Runs the toy suite with ``config`` (see :data:`DEFAULTS`); figures go to
    ``out_dir / "figures"``. Returns the results for :func:`benchmarks.report.write_report`."""
    layer = int(config["layer"])
    names = list(config["methods"])
    all_options: Mapping[str, Any] = config.get("method_options", {})
    per_seed: Dict[str, List[Dict[str, Any]]] = {name: [] for name in names}
    models: List[Dict[str, Any]] = []
    first = _FirstSeed({}, [], [], {})

    for seed_index, seed in enumerate(bar(list(config["seeds"]), verbose, desc="seeds")):
        train, valid = seed_data(config, seed)
        model, model_info = load_toy_model(config, seed, train, valid, verbose)
        models.append(model_info)
        how = "cached" if model_info["cached"] else f"trained in {model_info['train_seconds']:.1f} s"
        log(verbose, f"[toy] seed {seed}: model accuracy {model_info['accuracy']:.4f} ({how})")

        ctx = method_context(model, train, layer, seed, verbose)
        prepared_methods: Dict[str, PreparedMethod] = {}
        held_out_scores: Dict[str, torch.Tensor] = {}
        for name in bar(names, verbose, desc=f"seed {seed} methods"):
            options = dict(all_options.get(name, {}))
            chunk = int(options.pop("chunk", config.get("chunk", 250)))
            record, prepared, scores = _run_method(name, options, ctx, valid, chunk)
            per_seed[name].append(record)
            if prepared is not None:
                prepared_methods[name] = prepared
                held_out_scores[name] = scores
        if seed_index == 0:
            first = _first_seed(config, model, train, valid, ctx, prepared_methods, held_out_scores, out_dir)
        del prepared_methods, held_out_scores

    speed = first.speed
    methods = {name: aggregate(per_seed[name], speed.get("methods", {}).get(name), all_options.get(name, {}))
               for name in names}
    results = {
        "title": "Toy task: attributions to the FFNN output against the ground truth",
        "metrics": METRICS,
        "methods": methods,
        "paper": PAPER,
        "paper_source": PAPER_SOURCE,
        "models": models,
        "speed": {k: v for k, v in speed.items() if k != "methods"},
        "figures": first.figures,
        "extras": first.extras,
    }
    results["checks"] = checks(results, config)
    results["notes"] = summary_notes(results, config) + first.notes
    return results


def _run_method(
    name: str, options: Mapping[str, Any], ctx: MethodContext, valid: ToyData, chunk: int
) -> Tuple[Dict[str, Any], Optional[PreparedMethod], Optional[torch.Tensor]]:
    r"""One method on one seed: set up, the held-out set attributed (``chunk``
    examples per call) and scored. Returns its per-seed record, and the method
    and its (N, T) scores (None when it failed: the record says why)."""
    seed, verbose = ctx.seed, ctx.verbose
    record: Dict[str, Any] = {"seed": seed}
    try:
        prepared = prepare(name, ctx, options)
        scores, seconds = _attribute_all(prepared, valid, ctx.layer, chunk, seed, verbose)
        record.update(score(scores, valid))
        record.update({
            "setup_seconds": prepared.setup_seconds,
            "attribute_seconds": seconds,
            **prepared.info,
        })
        log(verbose, f"[toy] seed {seed} {name}: JS {record['js']:.4f}, KL {record['kl']:.4f}"
                     f" (setup {prepared.setup_seconds:.1f} s, attribute {seconds:.1f} s)")
        return record, prepared, scores
    except ImportError as error:
        record.update({"status": "unavailable", "error": str(error)})
        log(verbose, f"[toy] {name}: unavailable ({error})")
    except Exception as error:  # noqa: BLE001 - a failing method is a result, not a crash
        record.update({"status": "failed", "error": error_text(error),
                       "traceback": traceback.format_exc(limit=6)})
        log(verbose, f"[toy] seed {seed} {name}: FAILED {error_text(error)}")
    return record, None, None


class _FirstSeed(NamedTuple):
    r"""What only the first seed measures: the speed of every method, the
    figures and their notes, and the numbers beside the table (``extras``)."""

    speed: Dict[str, Any]
    figures: List[Dict[str, str]]
    notes: List[str]
    extras: Dict[str, Any]


def _first_seed(
    config: Mapping[str, Any], model: ToyModel, train: ToyData, valid: ToyData, ctx: MethodContext,
    prepared: Mapping[str, PreparedMethod], held_out_scores: Mapping[str, torch.Tensor], out_dir: Path,
) -> _FirstSeed:
    r"""The first seed's extra measurements: a uniform attribution's JS, the
    speed of every method, and the figures (with their notes and the input-mode
    DiffMask's numbers)."""
    extras: Dict[str, Any] = {}
    figures: List[Dict[str, str]] = []
    notes: List[str] = []
    truth = toy_ground_truth(valid.ids, valid.query, valid.mask)
    uniform = summarize(js_to_ground_truth(valid.mask.float(), truth, valid.mask))
    extras["uniform_js"] = uniform["mean"]
    speed = measure_speed(model, valid, prepared, ctx.layer, config["speed"], ctx.verbose)
    if config.get("figures", True):
        figures, figure_notes, input_mode = make_figures(
            model, train, valid, ctx, prepared, held_out_scores, config, out_dir, ctx.verbose
        )
        notes.extend(figure_notes)
        extras.update(input_mode)
    return _FirstSeed(speed, figures, notes, extras)


def measure_speed(
    model: ToyModel, valid: ToyData, prepared: Mapping[str, PreparedMethod], layer: int,
    options: Mapping[str, Any], verbose: bool,
) -> Dict[str, Any]:
    r"""Seconds per example of every prepared method and of one plain forward pass,
    on the same batch of held-out examples: the median of up to ``repeats`` calls
    (stopping once ``budget_seconds`` are spent, at least one call)."""
    batch = min(int(options["batch_size"]), len(valid))
    ids, query, mask = valid.ids[:batch], valid.query[:batch], valid.mask[:batch]
    repeats, budget = int(options["repeats"]), float(options["budget_seconds"])

    def forward() -> None:
        with torch.no_grad():
            model(ids, query, mask)

    forward_seconds, forward_calls = median_seconds(forward, max(repeats, 20), budget, warmup=True)
    result: Dict[str, Any] = {
        "batch_size": batch,
        "forward_seconds": forward_seconds,
        "forward_seconds_per_example": forward_seconds / batch,
        "forward_calls": forward_calls,
        "threads": torch.get_num_threads(),
        "methods": {},
    }
    for name, method in bar(list(prepared.items()), verbose, desc="speed"):
        try:
            # already warm: the method has just attributed the whole held-out set
            seconds, calls = median_seconds(
                lambda: method.attribute(ids, (query, mask), layer), repeats, budget, warmup=False
            )
        except Exception as error:  # noqa: BLE001
            result["methods"][name] = {"speed_error": error_text(error)}
            continue
        result["methods"][name] = {
            "seconds_per_example": seconds / batch,
            "ratio_to_forward": seconds / forward_seconds,
            "speed_calls": calls,
        }
    return result


