"""The sst suite's run: the model and sentences, DiffMask in both modes for
every seed, the comparison methods' [CLS] share, the layers a token is kept,
the figures, speed, and the results."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_diffmask import Convergence, DiffMask, swap_test
from captum_diffmask.model.forward import model_device
from benchmarks.tasks import sst_bert
from benchmarks.tasks.sst import SSTSentence
from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.methods import MethodContext
from benchmarks.progress import log_to_stderr
from benchmarks.workers import check_workers, Job, run_jobs
from benchmarks.common.minilm.attributions import attribute_at, per_sentence, prepare_method
from benchmarks.suites.sst.figures import groups_figure, heatmaps
from benchmarks.common.minilm.convergence import first_verdict_tolerances
from benchmarks.common.minilm.fit_cache import (certificate_due, certified_fit, fit_files, mode_settings, stored_fit,
                                                with_certificate)
from benchmarks.common.minilm.fitting import certify_fit, faithfulness, fit_diffmask, OnDevice
from benchmarks.common.minilm.loading import Bench, load_bench
from benchmarks.suites.sst.scoring import (
    aggregate_std, cls_share, cls_share_table, label_groups, layers_kept_by_group, mean_faithfulness, stability,
)
from benchmarks.suites.sst.settings import METHODS
from benchmarks.suites.sst.speed import measure_speed


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""Runs the SST suite with ``config`` (see :data:`DEFAULTS`); figures go to
    ``out_dir / "figures"``."""
    seeds = _check_config(config)
    notes: List[str] = []
    figures_dir = out_dir / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    bench = load_bench(config, verbose)
    L = bench.layers
    diffmask, attributions, explainers = fit_diffmask_modes(config, bench, seeds, verbose)
    paper = paper_recipe(config, bench, verbose)
    method_records, prepared = run_methods(config, bench, seeds[0], verbose)
    cls_shares = cls_share_table([a[:, L] for a in attributions["hidden"][0]], method_records)
    groups = layers_kept(config, bench.evaluated, attributions, notes)
    figures = {"layers_kept": groups_figure(groups, L, figures_dir / "sst_layers_kept.png")}
    figures["heatmaps"] = heatmaps(config, bench, explainers, prepared, figures_dir, notes)
    speed = measure_speed(config, bench, explainers, prepared, diffmask, seeds[0], verbose)
    return {
        "title": f"SST-5 with {bench.model_info['source']} ({L} layers): DiffMask on inputs and hidden states",
        "split": config.get("split", "dev"), "model": bench.model_info, "diffmask": diffmask, "methods": method_records,
        "cls_share": cls_shares, "layers_kept": groups, "speed": speed, "notes": notes, "paper_recipe": paper,
        "figures": figures, "seeds": seeds, "stability_seeds": config.get("stability_seeds") or None,
    }


def _check_config(config: Mapping[str, Any]) -> List[int]:
    r"""The seeds; a ``ValueError`` naming the key of a setting the suite cannot run."""
    seeds = [int(s) for s in config["seeds"]]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    extra, layers = stability_seeds(config)
    if extra and not layers:
        raise ValueError("stability_seeds: layers must name at least one layer")
    if set(extra) & set(seeds) or len(set(extra)) != len(extra):
        raise ValueError(f"stability_seeds: seeds {extra} must differ from each other and from seeds {seeds}")
    split = config.get("split", "dev")
    if split not in ("dev", "test"):
        raise ValueError(f"split must be 'dev' or 'test', got {split!r}")
    unknown = [m for m in config["methods"] if m not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; the sst suite runs {', '.join(METHODS)}")
    return seeds


def stability_seeds(config: Mapping[str, Any]) -> Tuple[List[int], List[int]]:
    r"""The seeds fitted for the stability alone (``config["stability_seeds"]``)
    and the layers they fit; two empty lists when there are none."""
    extra = config.get("stability_seeds") or {}
    return [int(s) for s in extra.get("seeds", [])], [int(k) for k in extra.get("layers", [])]


def fit_config(config: Mapping[str, Any], seed: int) -> Mapping[str, Any]:
    r"""The configuration a seed's fit runs with: a stability seed's fits train
    its ``layers`` alone (its fit cache key says so); every other seed's, the
    configuration as it is."""
    extra, layers = stability_seeds(config)
    if seed not in extra:
        return config
    return {**config, "diffmask": {**config["diffmask"], "layers": layers}}


def fit_diffmask_modes(
    config: Mapping[str, Any], bench: Bench, seeds: List[int], verbose: bool, attribute: bool = True,
) -> Tuple[Dict[str, Any], Dict[str, List[List[Tensor]]], Dict[str, DiffMask]]:
    r"""
    DiffMask in input and hidden mode, fitted once per seed (and per stability
    seed at its layers, :func:`stability_seeds`), each fit's faithfulness and
    attributions on the evaluated sentences.

    Args:

        config (Mapping): the suite's configuration.
        bench (Bench): the model and the sentences.
        seeds (list of int): the seeds whose fits train every layer.
        verbose (bool): progress bars and a line per fit.
        attribute (bool, optional): False leaves out the attributions of the
                    evaluated sentences (and so the stability). Default: True

    Returns:
        *tuple* ``(diffmask, attributions, explainers)``: the results'
        ``diffmask`` (per mode: the runs of every seed, stability seeds last,
        the stability across all of them and the faithfulness averaged over
        them per layer), per mode and seed of ``seeds`` the (T, L + 1)
        attributions of every sentence, and per mode the first seed's explainer.
    """
    extra, layers = stability_seeds(config)
    diffmask: Dict[str, Any] = {}
    attributions: Dict[str, List[List[Tensor]]] = {"input": [], "hidden": []}
    explainers: Dict[str, DiffMask] = {}
    fitted = fit_in_workers(config, bench, seeds + extra, verbose)
    for mode in ("input", "hidden"):
        runs, every, partial = [], [], []
        for seed in seeds + extra:
            explainer, info = _fitted(config, bench, mode, seed, fitted, verbose)
            info["faithfulness"] = faithfulness(explainer, bench.evaluated, 64, verbose)
            if attribute:
                scores = per_sentence(bench.evaluated, 64, _attribution(explainer, None if seed in seeds else layers),
                                      verbose, f"attribute {mode}")
                (attributions[mode] if seed in seeds else partial).append(scores)
            info["tol_lambda_needed"] = _first_verdicts(config, bench, mode, seed)
            runs.append({"seed": seed, **info})
            every.append(explainer)
            if seed == seeds[0]:
                explainers[mode] = explainer
        # the seeds' masks under one objective, on the held-out train sentences
        held_out = OnDevice(bench.valid.loader(128, shuffle=False, sort_by_length=True), model_device(bench.model))
        compared = layers or None
        diffmask[mode] = {"runs": runs, "stability": _stability(attributions[mode], partial, runs, compared),
                          "swap": swap_test(every, held_out, compared) if len(every) > 1 else None,
                          "faithfulness": mean_faithfulness([r["faithfulness"] for r in runs])}
    return diffmask, attributions, explainers


def _fitted(
    config: Mapping[str, Any], bench: Bench, mode: str, seed: int,
    fitted: Mapping[Tuple[str, int], Tuple[DiffMask, Dict[str, Any]]], verbose: bool,
) -> Tuple[DiffMask, Dict[str, Any]]:
    r"""A seed's certified fit: from the workers (certified here if it is not
    yet), or fitted here through the fit cache."""
    config = fit_config(config, seed)
    if (mode, seed) in fitted:
        explainer, info = fitted[(mode, seed)]
        with_certificate(certify_fit, explainer, info, mode, bench.train, bench.valid, config, seed, verbose)
        return explainer, info
    log_to_stderr(verbose, f"[sst] DiffMask {mode}, seed {seed}")
    return certified_fit(fit_diffmask, certify_fit, bench.model, mode, bench.train, bench.valid, config, seed, verbose)


def _first_verdicts(
    config: Mapping[str, Any], bench: Bench, mode: str, seed: int
) -> Optional[Dict[str, Optional[float]]]:
    r"""Per layer, the least multiplier tolerance the fit's first verdict needed
    (:func:`first_verdict_tolerances`), from its state kept in the fit cache;
    None without one."""
    config = fit_config(config, seed)
    if not config.get("cache", True):
        return None
    files = fit_files(bench.model, mode, bench.train, bench.valid, config, seed)
    if not files.state.exists():
        return None
    criterion = Convergence(**(mode_settings(config, mode).get("convergence") or {}))
    return first_verdict_tolerances(torch.load(files.state, map_location="cpu", weights_only=True), criterion)


def _attribution(explainer: DiffMask, layers: Optional[List[int]]) -> Any:
    r"""``(ids, mask) -> (B, T, K)`` keep probabilities: at every layer when
    ``layers`` is None, else at those layers, in that order."""
    if layers is None:
        return lambda ids, mask: explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    return lambda ids, mask: torch.stack(
        [explainer.attribute(ids, additional_forward_args=(mask,), layer=k) for k in layers], -1)


def _stability(
    full: List[List[Tensor]], partial: List[List[Tensor]], runs: List[Mapping[str, Any]], layers: Optional[List[int]]
) -> Optional[Dict[str, Any]]:
    r"""The stability both ways over every seed: at ``layers`` (the stability
    seeds' own, the full seeds' attributions cut to them) or, when None, at
    every layer; None with fewer than two seeds' attributions."""
    per_seed = full if layers is None else [[a[:, layers] for a in seed] for seed in full] + partial
    result = stability(per_seed)
    if result is not None:
        result["layers"] = layers if layers is not None else list(range(per_seed[0][0].shape[-1]))
        result["masked_share_std"] = aggregate_std([r["faithfulness"] for r in runs], result["layers"])
    return result


def paper_recipe(config: Mapping[str, Any], bench: Bench, verbose: bool) -> Optional[Dict[str, Any]]:
    r"""
    The paper's recipe (``config["paper_recipe"]``) fitted in both modes and
    scored as the suite's own fits are (the same model, sentences and held-out
    scoring; fits in workers and through the fit cache likewise).

    Returns:
        *dict* ``{"epochs", "seeds", "diffmask": {mode: {"runs", "stability"
        (None: no attributions are taken), "faithfulness"}}}``, or None when
        the recipe is left out.
    """
    recipe = config.get("paper_recipe")
    if not recipe:
        return None
    seeds = [int(s) for s in recipe.get("seeds", config["seeds"][:1])]
    # the suite's split of the train sentences, so that a worker's bench is this one's
    split = {k: config["diffmask"][k] for k in ("validation_sentences", "validation_from") if k in config["diffmask"]}
    recipe_config = {**config, "diffmask": {**recipe["diffmask"], **split, "epochs": int(recipe["epochs"])},
                     "stability_seeds": None}
    log_to_stderr(verbose, f"[sst] the paper's recipe, {recipe['epochs']} epochs, seeds {seeds}")
    diffmask, _, _ = fit_diffmask_modes(recipe_config, bench, seeds, verbose, attribute=False)
    return {"epochs": int(recipe["epochs"]), "seeds": seeds, "diffmask": diffmask}


def _fit_job(config: Mapping[str, Any], mode: str, seed: int, path: str, verbose: bool) -> Dict[str, Any]:
    r"""One DiffMask fit in a worker process on one thread: the model and sentences
    loaded as the suite does, the fit through the fit cache (its progress when
    ``verbose``: off a terminal, a line per layer and epoch), the probe saved
    to ``path``; the fit's record."""
    bench = load_bench(config, False)
    explainer, info = certified_fit(fit_diffmask, certify_fit, bench.model, mode, bench.train, bench.valid,
                                    fit_config(config, seed), seed, verbose)
    explainer.save(path)
    return info


def fit_in_workers(
    config: Mapping[str, Any], bench: Bench, seeds: List[int], verbose: bool
) -> Dict[Tuple[str, int], Tuple[DiffMask, Dict[str, Any]]]:
    r"""
    Every (mode, seed) fit in ``workers`` processes side by side (spawned, one
    torch thread each; input mode, the longer, first), each probe loaded back
    onto this process's model; a fit the cache holds is loaded, not refitted
    (:mod:`benchmarks.common.minilm.fit_cache`), and its certificate, when
    due, is measured in a worker too; nothing when ``workers`` is 1
    (the fits then run here, one after the other). Every fit is seeded by its
    seed alone, so the probes are those of one process (up to the threads'
    rounding).

    Returns:
        *dict* ``(mode, seed) -> (explainer, the fit's record)``.
    """
    workers = check_workers(config.get("workers", 1))
    if workers == 1:
        return {}
    fitted = _stored_fits(config, bench, seeds, verbose)
    jobs = [(mode, seed) for mode in ("input", "hidden") for seed in seeds if (mode, seed) not in fitted]
    with tempfile.TemporaryDirectory() as folder:
        paths = {job: os.path.join(folder, f"{job[0]}-{job[1]}.pt") for job in jobs}
        infos = run_jobs([Job(f"DiffMask {mode}, seed {seed}", _fit_job,
                              (dict(config), mode, seed, paths[(mode, seed)], verbose)) for mode, seed in jobs],
                         workers, verbose, "[sst] ")
        for job, info in zip(jobs, infos):
            log_to_stderr(verbose, f"[sst] DiffMask {job[0]}, seed {job[1]}: fitted in a worker "
                                   f"({info['seconds'] / 60:.1f} min, {info['steps']} steps)")
            explainer = DiffMask.load(paths[job], bench.model)
            explainer.convergence = {int(k): report for k, report in info["convergence"].items()}
            fitted[job] = (explainer, info)
    return fitted


def _stored_fits(
    config: Mapping[str, Any], bench: Bench, seeds: List[int], verbose: bool
) -> Dict[Tuple[str, int], Tuple[DiffMask, Dict[str, Any]]]:
    r"""The (mode, seed) fits the fit cache holds with their certificate due
    measured (:func:`certificate_due`), loaded onto the bench's model; a fit
    whose certificate is due is left to a worker."""
    stored = {}
    for mode in ("input", "hidden"):
        for seed in seeds:
            loaded = stored_fit(bench.model, mode, bench.train, bench.valid, fit_config(config, seed), seed)
            if loaded is not None and certificate_due(bench.model, loaded[1], mode, bench.train, bench.valid,
                                                      fit_config(config, seed), seed):
                log_to_stderr(verbose, f"[sst] DiffMask {mode}, seed {seed}: from the fit cache, "
                                       "its certificate measured in a worker")
            elif loaded is not None:
                log_to_stderr(verbose, f"[sst] DiffMask {mode}, seed {seed}: from the fit cache "
                                       f"(fitted at commit {loaded[1]['stored']['commit']}, {loaded[1]['stored']['date']})")
                stored[(mode, seed)] = loaded
    return stored


def run_methods(
    config: Mapping[str, Any], bench: Bench, seed: int, verbose: bool
) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    r"""
    Every comparison method at the last layer: its [CLS] share on the
    ``cls_sentences`` first evaluated sentences (all when None).

    Args:

        config (Mapping): the suite's configuration.
        bench (Bench): the model and the sentences.
        seed (int): the methods' seed.
        verbose (bool): progress bars and a line per failure.

    Returns:
        *tuple* ``(records, prepared)``: every method's record (a failure is
        recorded, not raised), and the methods that were set up.
    """
    evaluated, L = bench.evaluated, bench.layers
    cls_data = evaluated if config.get("cls_sentences") is None else evaluated.subset(torch.arange(min(len(evaluated), int(config["cls_sentences"]))))
    ctx = MethodContext(
        model=bench.model, sites=lambda: None, padding_mask_arg="auto",
        train_loader=lambda batch_size, s: bench.train.loader(batch_size, shuffle=True, seed=s, sort_by_length=True),
        layer=L, seed=seed, verbose=False,
    )
    prepared: Dict[str, Any] = {}
    method_records: Dict[str, Dict[str, Any]] = {}
    for name in config["methods"]:
        options = dict(config.get("method_options", {}).get(name, {}))
        record: Dict[str, Any] = {"options": options}
        try:
            method, setup = prepare_method(name, options, record, ctx, L)
            start = time.perf_counter()
            scores = per_sentence(cls_data, 32, lambda ids, mask: attribute_at(method, ids, mask, L), verbose, f"{name} [CLS]")
            record["seconds_last_layer"] = time.perf_counter() - start
            record.update(cls_share(scores))
            record["setup_seconds"] = setup
            record["status"] = "ok"
            prepared[name] = method
        except Exception as error:  # noqa: BLE001 - one failing method must not sink the suite
            record.update({"status": "failed", "error": f"{type(error).__name__}: {error}"})
            log_to_stderr(verbose, f"[sst] {name} failed: {record['error']}")
        method_records[name] = record
    return method_records, prepared


def layers_kept(
    config: Mapping[str, Any], evaluated: EncodedSST, attributions: Mapping[str, List[List[Tensor]]], notes: List[str]
) -> Dict[str, Any]:
    r"""The results' ``layers_kept``: per mode, the layers a token is kept
    (attributions averaged over the seeds) by the word's sentiment label and,
    when the POS tagger is there (``pos``), by part of speech; ``notes`` gets
    a line when it is skipped."""
    groups: Dict[str, Any] = {}
    mean_attr = {mode: [torch.stack(list(s)).mean(0) for s in zip(*attributions[mode])] for mode in ("input", "hidden")}
    for mode in ("input", "hidden"):
        groups[mode] = {"sentiment": layers_kept_by_group(mean_attr[mode], evaluated, label_groups)}
    tags = _pos_groups(config, evaluated.sentences, notes)
    if tags is not None:
        for mode in ("input", "hidden"):
            groups[mode]["pos"] = layers_kept_by_group(mean_attr[mode], evaluated, lambda row, s: tags[row])
    return groups


def _pos_groups(config: Mapping[str, Any], sentences: Sequence[SSTSentence], notes: List[str]) -> Optional[List[Tuple[str, ...]]]:
    wanted = config.get("pos", "auto")
    if wanted is False:
        return None
    try:
        return sst_bert.pos_tags(sentences)
    except ImportError as error:
        if wanted is True:
            raise
        notes.append(f"Part-of-speech groups skipped: {error}")
        return None
