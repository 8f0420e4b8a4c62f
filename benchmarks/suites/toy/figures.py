"""The toy suite's figures: the attributions of one held-out example by every method, and the model's hidden states."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch

from benchmarks.methods import MethodContext, prepare, PreparedMethod, route_options
from benchmarks.progress import error_text
from benchmarks.suites.toy.scoring import method_context, pick_example
from captum_diffmask import DiffMask
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.evaluation.ground_truth import js_to_ground_truth, summarize
from captum_diffmask.evaluation.toy_task import toy_ground_truth, toy_sites, ToyData, ToyModel
from captum_diffmask.interface.figures import attribution_panels, hidden_state_scatter
from captum_diffmask.model.sites import SiteLocator


class _Example(NamedTuple):
    r"""The figure's held-out example: its row and real length, and its (1, T)
    ids, query and mask."""

    index: int
    length: int
    ids: torch.Tensor
    query: torch.Tensor
    mask: torch.Tensor


def make_figures(
    model: ToyModel, train: ToyData, valid: ToyData, ctx: MethodContext,
    prepared: Mapping[str, PreparedMethod], held_out_scores: Mapping[str, torch.Tensor],
    config: Mapping[str, Any], out_dir: Path, verbose: bool,
) -> Tuple[List[Dict[str, str]], List[str], Dict[str, Any]]:
    r"""The paper's toy figure (one example, every method) and its appendix figure
    (the 2-D FFNN states by digit class)."""
    figure_dir = out_dir / "figures"
    figure_dir.mkdir(parents=True, exist_ok=True)
    notes: List[str] = []
    extras: Dict[str, Any] = {}
    layer = int(config["layer"])
    index = pick_example(valid)
    at = slice(index, index + 1)
    example = _Example(index, int(valid.mask[index].sum()), valid.ids[at], valid.query[at], valid.mask[at])

    # Input attributions (layer 0) of every method, as in the paper's figure, and
    # DiffMask in input mode reading the embeddings (layer 0) or the FFNN output (layer 1).
    input_rows = _layer0_rows(model, train, ctx.seed, prepared, config, example, notes)
    _diffmask_input_rows(model, train, valid, ctx.seed, config, example, input_rows, notes, extras, verbose)
    figures = [_attribution_figure(valid, example, held_out_scores, input_rows, layer, figure_dir)]
    hidden_states = _hidden_states_figure(model, valid, layer, figure_dir)
    if hidden_states is not None:
        figures.append(hidden_states)
    return figures, notes, extras


def _layer0_rows(
    model: ToyModel, train: ToyData, seed: int, prepared: Mapping[str, PreparedMethod], config: Mapping[str, Any],
    example: _Example, notes: List[str],
) -> Dict[str, Any]:
    r"""Every method (but DiffMask) set up again at the input (layer 0), its
    attribution of the example; a note per method that fails."""
    input_rows: Dict[str, Any] = {}
    for name in prepared:
        if name == "DiffMask":
            continue  # fitted in hidden mode at layer 1 only; its input rows come from input mode
        options = dict(config.get("method_options", {}).get(name, {}))
        options.pop("chunk", None)
        try:
            method = prepare(name, method_context(model, train, 0, seed, False), options)
            torch.manual_seed(seed)
            input_rows[name] = method.attribute(example.ids, (example.query, example.mask), 0)[0, : example.length]
        except Exception as error:  # noqa: BLE001
            notes.append(f"Figure: {name} at layer 0 failed ({error_text(error)}); left out.")
    return input_rows


def _diffmask_input_rows(
    model: ToyModel, train: ToyData, valid: ToyData, seed: int, config: Mapping[str, Any], example: _Example,
    input_rows: Dict[str, Any], notes: List[str], extras: Dict[str, Any], verbose: bool,
) -> None:
    r"""DiffMask fitted in input mode (``diffmask_input``): its rows of the
    example at both depths go to ``input_rows``, its JS and keep share over the
    held-out set and its fit to ``extras``; a failure to ``notes``."""
    try:
        dm_input, fit_seconds, info = fit_input_diffmask(model, train, config["diffmask_input"], seed, verbose)
        for k in (0, 1):
            label = "DiffMask input, reads embeddings (layer 0)" if k == 0 else "DiffMask input, reads FFNN output (layer 1)"
            input_rows[label] = dm_input.attribute(example.ids, additional_forward_args=(example.query, example.mask),
                                                   layer=k)[0, : example.length]
        # the same two views over the whole held-out set, scored against the ground truth
        held_truth = toy_ground_truth(valid.ids, valid.query, valid.mask)
        for k in (0, 1):
            keep = dm_input.attribute(valid.ids, additional_forward_args=(valid.query, valid.mask), layer=k)
            extras[f"diffmask_input_js_layer{k}"] = summarize(js_to_ground_truth(keep, held_truth, valid.mask))["mean"]
            extras[f"diffmask_input_keep_layer{k}"] = float(keep[valid.mask].mean())
        extras["diffmask_input_fit_seconds"] = fit_seconds
        extras["diffmask_input_fit_last"] = info["fit_last"]
    except Exception as error:  # noqa: BLE001
        notes.append(f"Figure: DiffMask in input mode failed ({error_text(error)}); left out.")


def _attribution_figure(
    valid: ToyData, example: _Example, held_out_scores: Mapping[str, torch.Tensor], input_rows: Mapping[str, Any],
    layer: int, figure_dir: Path,
) -> Dict[str, str]:
    r"""The paper's toy figure: the example's attributions to the FFNN output
    (as scored) above its input rows."""
    index, length = example.index, example.length
    n, m = int(example.query[0, 0]), int(example.query[0, 1])
    tokens = [str(int(t)) for t in example.ids[0, :length]]
    truth = toy_ground_truth(example.ids, example.query, example.mask)[0, :length]
    hidden_rows: Dict[str, Any] = {"ground truth": truth}
    for name, scores in held_out_scores.items():
        hidden_rows[name] = scores[index, :length]
    panels = [(f"attribution to the FFNN output (hidden.{layer}), as scored", hidden_rows)]
    if input_rows:
        panels.append(("input attributions (layer 0) and DiffMask input mode at both depths", input_rows))
    path = figure_dir / "toy_attributions.png"
    label = "more n than m" if float(valid.labels[index]) > 0.5 else "not more n than m"
    attribution_panels(tokens, panels, path=path, highlight=(truth > 0).tolist(),
                       title=f"held-out example {index}: query n={n}, m={m} ({label}); red = ground truth")
    return {"file": f"figures/{path.name}", "caption": (
        "One held-out example. Top: every method's attribution to the FFNN output states (what the table scores), "
        "each row scaled to [0, 1]; the ground truth marks the positions holding n or m. Bottom: input attributions "
        "(layer 0), and DiffMask in input mode when its votes read only the embeddings (layer 0) or the FFNN "
        "output (layer 1), the paper's toy figure.")}


def _hidden_states_figure(model: ToyModel, valid: ToyData, layer: int, figure_dir: Path) -> Optional[Dict[str, str]]:
    r"""The appendix figure: the 2-D FFNN output of every real held-out
    position, by digit class; None when the states are not 2-D."""
    locator = SiteLocator.locate(model, toy_sites(model))
    with torch.no_grad(), locator.capture([f"hidden.{layer}"]) as states:
        model(valid.ids, valid.query, valid.mask)
    hidden = states[f"hidden.{layer}"]
    if hidden.shape[-1] != 2:
        return None
    real = valid.mask
    is_n = (valid.ids == valid.query[:, :1])[real]
    is_m = (valid.ids == valid.query[:, 1:])[real]
    categories = ["= n" if a else "= m" if b else "neither" for a, b in zip(is_n.tolist(), is_m.tolist())]
    path = figure_dir / "toy_hidden_states.png"
    hidden_state_scatter(hidden[real], categories, path=path, order=["neither", "= n", "= m"],
                         title="FFNN output (hidden.1) of held-out digits")
    return {"file": f"figures/{path.name}", "caption": (
        "The toy model's 2-D FFNN output for every real held-out position, by whether the digit is the "
        "query's n, its m, or neither (the paper's appendix figure): query digits separate from the rest.")}


def fit_input_diffmask(
    model: ToyModel, train: ToyData, options: Mapping[str, Any], seed: int, verbose: bool
) -> Tuple[DiffMask, float, Dict[str, Any]]:
    options = dict(options)
    batch_size = int(options.pop("batch_size", 128))
    stages = options.pop("stages", None) or [{}]
    routed, ignored = route_options({"mode": "input", **options}, [("init", DiffMask.__init__)])
    if ignored:
        raise ValueError(f"diffmask_input: unknown options {ignored}")
    start = time.perf_counter()
    dm = DiffMask(model, sites=toy_sites(model), padding_mask_arg=1, **routed["init"])
    history: List[Dict[str, Any]] = []
    for number, stage in enumerate(stages):  # one fit per stage, e.g. deepest layer first
        stage = {"seed": seed + number, "verbose": verbose, **stage}
        fit_options, ignored = route_options(stage, [("fit", DiffMask.fit)])
        if ignored:
            raise ValueError(f"diffmask_input: unknown options in stage {number}: {ignored}")
        loader = train.loader(batch_size, shuffle=True, seed=seed + number)
        history += dm.fit(loader, **grouped_options(fit_options["fit"]))
    return dm, time.perf_counter() - start, {"fit_last": [h for h in history if h["epoch"] == history[-1]["epoch"]]}
