"""What the toy-lm suite measures beyond the table: DiffMask at every layer, the
attribution cost per generated token, and the figures (first seed)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

import torch

from benchmarks.methods import AUTHORS_OPTIONS, PreparedMethod
from benchmarks.progress import log
from benchmarks.tasks.toy_lm import token_text, ToyText
from captum_diffmask import DiffMask, DiffMaskConvergenceWarning
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.evaluation.ground_truth import js_to_ground_truth, kl_to_ground_truth, summarize
from captum_diffmask.interface.figures import attribution_panels
from captum_diffmask.interface.generation import attribute_generation, greedy_continuation
from captum_diffmask.methods import IntegratedGradients, Occlusion
from captum_diffmask.model.forward import ModelForward
from captum_diffmask.model.sites import SiteLocator


def score(scores: torch.Tensor, data: ToyText) -> Dict[str, Any]:
    r"""JS and KL of ``scores`` (N, T) on the digits of ``x`` to the ground truth."""
    js = js_to_ground_truth(scores, data.truth, data.digits)
    kl = kl_to_ground_truth(scores, data.truth, data.digits)
    has_truth = data.truth.sum(-1) > 0
    js_summary, kl_summary = summarize(js), summarize(kl)
    return {"js": js_summary["mean"], "js_std_examples": js_summary["std"], "kl": kl_summary["mean"],
            "kl_std_examples": kl_summary["std"], "kl_finite": kl_summary["finite_mean"],
            "kl_inf_share": kl_summary["inf_share"], "scored": js_summary["count"],
            "unscored": int((torch.isnan(js) & has_truth).sum())}


def architecture(config: Mapping[str, Any]) -> str:
    r"""The model the prompts are written for, ``config["model"]["architecture"]``:
    ``"decoder"`` (the default) or ``"encoder"``
    (:data:`benchmarks.tasks.toy_lm.ARCHITECTURES`)."""
    return str(config["model"].get("architecture", "decoder"))


def every_layer(config: Mapping[str, Any], model: Any, train: ToyText, valid: ToyText,
                verbose: bool) -> Tuple[List[Dict[str, Any]], DiffMask]:
    r"""A DiffMask fitted on every layer at once (``diffmask_every_layer``), scored
    at each: rows with JS, KL, the mean keep probability over real tokens and the
    fit's convergence status; and the fitted DiffMask."""
    options = dict(config["diffmask_every_layer"])
    batch_size = int(options.pop("batch_size", 64))
    init = {"l0": options.pop("l0")} if "l0" in options else {}  # the constructor's; the rest are fit's
    dm = DiffMask(model, mode="hidden", output="last", **init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiffMaskConvergenceWarning)  # the status is reported per layer
        dm.fit(list(train.batches(batch_size, shuffle=True, seed=0)), seed=0, verbose=verbose,
               **grouped_options(options))
    every = dm.attribute(valid.ids, additional_forward_args=(valid.mask,), layer=None)
    real = valid.mask.bool()
    groups = position_groups(valid)
    rows = [{"layer": k, **score(every[..., k], valid), "keep": float(every[..., k][real].mean()),
             "keep_by_group": {name: float(every[..., k][where].mean()) for name, where in groups.items()},
             "status": dm.convergence.get(k, {}).get("status", "n/a")} for k in range(every.shape[-1])]
    log(verbose, "[toy-lm] DiffMask at every layer: " + ", ".join(f"hidden.{r['layer']} JS {r['js']:.4f}"
                                                              for r in rows))
    return rows, dm


def position_groups(data: ToyText) -> Dict[str, torch.Tensor]:
    r"""(N, T) masks of the prompts' parts: the query's two tokens, the digits
    of the ground truth (holding n or m), the other digits, and the rest (``:``
    and ``->``)."""
    real = data.mask.bool()
    query = real & (data.mask.cumsum(1) <= 2)
    return {"query": query, "digits (ground truth)": data.truth > 0, "digits (others)": data.digits & (data.truth == 0),
            ": and ->": real & ~query & ~data.digits}


def _speed_methods(config: Mapping[str, Any], model: Any, prepared: Mapping[str, PreparedMethod]) -> Dict[str, Any]:
    r"""The methods timed per generated token: the fitted DiffMask, IG and occlusion."""
    methods: Dict[str, Any] = {}
    for name, options in config["speed"]["methods"].items():
        if name == "DiffMask" and "DiffMask" in prepared:
            methods[name] = (prepared["DiffMask"].explainer, dict(options))
        elif name == "IntegratedGradients":
            methods[name] = (IntegratedGradients(model, **AUTHORS_OPTIONS[name]), dict(options))
        elif name == "Occlusion":
            methods[name] = (Occlusion(model), dict(options))
    return methods


def generation_speed(config: Mapping[str, Any], model: Any, valid: ToyText, prepared: Mapping[str, PreparedMethod],
                     verbose: bool) -> Dict[str, Any]:
    r"""
    Attribution cost per generated token against one forward step: prompts of
    the held-out set are continued greedily (``max_new_tokens``, one forward pass
    of the whole prefix per step, no cache: the reference step), then every
    step is attributed by :func:`attribute_generation` with the same continuation.

    Returns:
        *dict*: ``forward_step_seconds``, ``tokens`` and per method
        ``seconds_per_token`` and ``ratio_to_forward_step``.
    """
    options = config["speed"]
    layer = int(config["layer"])
    prompts = [valid.ids[i][valid.mask[i].bool()] for i in range(int(options["prompts"]))]
    new = int(options["max_new_tokens"])
    start = time.perf_counter()
    continuations = [greedy_continuation(model, prompt, new) for prompt in prompts]
    forward = time.perf_counter() - start
    tokens = sum(len(c) for c in continuations)
    result: Dict[str, Any] = {"forward_step_seconds": forward / tokens, "tokens": tokens, "prompts": len(prompts),
                              "layer": layer, "threads": torch.get_num_threads(), "methods": {}}
    for name, (method, method_options) in _speed_methods(config, model, prepared).items():
        start = time.perf_counter()
        for prompt, continuation in zip(prompts, continuations):
            attribute_generation(model, method, prompt, continuation=continuation, layer=layer, **method_options)
        per_token = (time.perf_counter() - start) / tokens
        result["methods"][name] = {"seconds_per_token": per_token,
                                   "ratio_to_forward_step": per_token / result["forward_step_seconds"],
                                   "options": method_options}
        log(verbose, f"[toy-lm] {name}: {per_token * 1e3:.2f} ms per generated token "
                     f"({per_token / result['forward_step_seconds']:.1f}x one forward step)")
    return result


def _example(valid: ToyText) -> int:
    r"""The first held-out prompt with both query digits in ``x`` and at least 7 digits."""
    for index in range(len(valid)):
        hits = valid.truth[index].sum()
        if valid.digits[index].sum() >= 7 and 2 <= hits < valid.digits[index].sum():
            return index
    return 0


def attribution_figure(valid: ToyText, held_out: Mapping[str, torch.Tensor], layers: torch.Tensor, layer: int,
                       figure_dir: Path, stem: str = "toy_lm") -> Dict[str, str]:
    r"""One held-out prompt: every method at ``layer`` (as scored) above DiffMask
    at every layer; the ground truth's digits in red."""
    index = _example(valid)
    real = valid.mask[index].bool()
    tokens = [token_text(int(t)) for t in valid.ids[index][real]]
    truth = valid.truth[index][real]
    rows: Dict[str, Any] = {"ground truth": truth}
    rows.update({name: scores[index][real] for name, scores in held_out.items()})
    depth = {f"DiffMask hidden.{k}": layers[index][real][:, k] for k in range(layers.shape[-1])}
    path = figure_dir / f"{stem}_attributions.png"
    answer = "yes" if int(valid.answers[index]) == 3 else "no"
    attribution_panels(tokens, [(f"attribution to hidden.{layer} (as scored), rows scaled to [0, 1]", rows),
                                ("DiffMask (fitted on every layer) at every layer, rows scaled to [0, 1]", depth)],
                       path=path, highlight=(truth > 0).tolist(),
                       title=f"held-out prompt {index} (answer {answer}); red = ground truth")
    return {"file": f"figures/{path.name}", "caption": (
        "One held-out prompt. Top: every method's attribution to the states of the layer the table scores, each row "
        "scaled to [0, 1]; the ground truth marks the digits holding n or m (the query, ':' and '->' are not "
        "scored). Bottom: the keep probabilities of the DiffMask fitted on every layer, at each layer, each row "
        "scaled to [0, 1] (the per-layer table gives their mean as it is).")}


def generation_figure(model: Any, dm: DiffMask, valid: ToyText, figure_dir: Path) -> List[Dict[str, str]]:
    r"""DiffMask's attribution of a short generation at every layer (PNG and HTML)."""
    index = _example(valid)
    prompt = valid.ids[index][valid.mask[index].bool()]
    result = attribute_generation(model, dm, prompt, max_new_tokens=3, layer=None)
    result.tokens = [token_text(int(t)) for t in result.ids]
    result.plot(figure_dir / "toy_lm_generation.png")
    result.to_html(figure_dir / "toy_lm_generation.html")
    return [{"file": "figures/toy_lm_generation.png", "caption": (
        "attribute_generation with the DiffMask fitted on every layer: the decoder answers, then keeps generating (it was "
        "trained on the answer only, so the later tokens are not meaningful); each row is one generated token "
        "against every token before it. The same view as a self-contained page: "
        "`figures/toy_lm_generation.html`.")}]


def first_seed_extras(config: Mapping[str, Any], model: Any, train: ToyText, valid: ToyText,
                      prepared: Mapping[str, PreparedMethod], held_out: Mapping[str, torch.Tensor], out_dir: Path,
                      verbose: bool) -> Dict[str, Any]:
    r"""The first seed's DiffMask at every layer, speed per generated token and figures."""

    decoder = architecture(config) == "decoder"  # an encoder generates nothing
    extras: Dict[str, Any] = {}
    if decoder:
        extras["generation_speed"] = generation_speed(config, model, valid, prepared, verbose)
    extras["diffmask_layers"], dm = every_layer(config, model, train, valid, verbose)
    if config.get("figures", True):
        figure_dir = out_dir / "figures"
        layers = dm.attribute(valid.ids, additional_forward_args=(valid.mask,), layer=None)
        # the decoder's figure keeps its name; an encoder's beside it in the same folder
        stem = "toy_lm" if decoder else "toy_encoder"
        extras["figures"] = [attribution_figure(valid, held_out, layers, int(config["layer"]), figure_dir, stem)]
        if decoder:
            extras["figures"] += generation_figure(model, dm, valid, figure_dir)
    return extras


@torch.no_grad()
def ground_truth_check(model: Any, valid: ToyText, layer: int) -> Dict[str, float]:
    r"""
    Is the ground truth what this model uses at ``hidden.layer``? The mean
    KL(original || replaced) of the answer distribution, and the share of answers
    that flip, when the states of the digits outside the ground truth (then:
    inside it) are replaced by the mean digit state, and when the query's two
    states are replaced by the mean query state. A decoder can build running
    counts along the digits with causal attention, and an encoder's query
    positions can count their digits with bidirectional attention, so the
    digits holding n or m need not be the only states it reads.

    Returns:
        *dict*: ``kl_others``, ``flip_others``, ``kl_truth``, ``flip_truth``,
        ``kl_query``, ``flip_query``.
    """
    locator = SiteLocator.locate(model, None)
    site = f"hidden.{layer}"
    forward = ModelForward(model, output="last")
    original = forward(valid.ids, (valid.mask,)).log_softmax(-1)
    with locator.capture([site]) as states:
        forward(valid.ids, (valid.mask,))
    query = position_groups(valid)["query"]
    digit_mean, query_mean = states[site][valid.digits].mean(0), states[site][query].mean(0)
    result: Dict[str, float] = {}
    for name, replaced, mean in (("others", valid.digits & (valid.truth == 0), digit_mean),
                                 ("truth", valid.truth > 0, digit_mean), ("query", query, query_mean)):
        with locator.replace({site: lambda h: torch.where(replaced.unsqueeze(-1), mean, h)}):
            changed = forward(valid.ids, (valid.mask,)).log_softmax(-1)
        result[f"kl_{name}"] = float((original.exp() * (original - changed)).sum(-1).mean())
        result[f"flip_{name}"] = float((changed.argmax(-1) != original.argmax(-1)).float().mean())
    return result
