r"""
The components suite's SST part: how many attention heads of each layer a
sentence needs for the model's output to stay put, per sentence (amortised
DiffMask) and for every sentence at once (the per-task mask).

The model is the sst suite's fine-tuned MiniLM (its cache; ``sst.model_from``:
``"full"`` or ``"quick"``, the configuration of the sst suite that trained it;
``sst.sst_suite``: changes to that configuration, e.g. a tiny model in tests).
Both masks are fitted on ``train_sentences`` train sentences (spread evenly over
those the sst suite fits DiffMask on) with fit's defaults changed by ``fit``
(options that name a constructor argument, as ``joint``, go to the
constructor; the per-task mask at the tracr part's lr), the sst suite's eps and
the model's passes in ``precision``, closed heads replaced by their learned
baselines (started at the mean head output). A joint mask (``joint``)
gates every block at once under one constraint; otherwise each block (layer k =
block k) is fitted with the others intact. On ``eval_sentences`` dev sentences,
per block: the heads kept (P > 0.5) per sentence, and for block-wise masks the
share of sentences whose prediction the block's kept heads keep and the KL;
with every block's kept heads at once too; each fit's steps and the multiplier
it ended at. The cost: fit seconds, attribution seconds per sentence, and the
per-task mask refitted on one sentence.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.common.minilm import loading as sst_loading
from benchmarks.fit_presets import PAPER_L0
from benchmarks.progress import log_to_stderr
from benchmarks.suites.components.tracr import (
    CONSTRUCTOR_OPTIONS, every_block_forward, fit_outcome, PER_TASK_LR, quiet_warnings,
)
from benchmarks.suites.sst import DEFAULTS as SST_DEFAULTS, QUICK as SST_QUICK
from captum_diffmask import DiffMask
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.model.divergences import example_kl, log_probs

#: The methods compared, and whether each is the per-task mask.
MASKS = (("DiffMask", False), ("per-task mask", True))


def sst_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    r"""The sst suite's configuration whose model this part reads."""
    from benchmarks.runner import merge

    base = SST_DEFAULTS
    if config.get("model_from", "full") == "quick":
        base = merge(base, SST_QUICK)
    return merge(base, {"data_dir": config.get("data_dir"), "eval_sentences": None, **config.get("sst_suite", {})})


def spread(count: int, limit: Optional[int]) -> Tensor:
    r"""At most ``limit`` of ``count`` row indices, spread evenly."""
    if limit is None or limit >= count:
        return torch.arange(count)
    return torch.linspace(0, count - 1, int(limit)).round().long().unique()


def run_sst(config: Mapping[str, Any], seed: int, verbose: bool,
            masks: Sequence[Tuple[str, bool]] = MASKS) -> Dict[str, Any]:
    r"""
    The masks on the sst suite's MiniLM.

    Args:

        config (Mapping): the suite's ``sst`` settings.
        seed (int): the fits' seed.
        verbose (bool): a line per fit.
        masks (sequence, optional): of :data:`MASKS` (parts of one run fitted
                    apart are put together by :func:`merge_sst`). Default: both

    Returns:
        *dict*: ``model`` (its record), ``methods`` (per method: per block the
        heads kept, agreement, KL and verdict; the cost), ``figure`` (the first
        sentences' tokens and P(kept), (sentences, L, H) per method).
    """
    bench = sst_loading.load_bench(sst_config(config), verbose)
    train = bench.train.subset(spread(len(bench.train), config.get("train_sentences")))
    evaluated = bench.evaluated.subset(spread(len(bench.evaluated), config.get("eval_sentences")))
    batch_size = int(config.get("batch_size", 32))
    eps = config.get("eps")
    eps = float(SST_DEFAULTS["diffmask"]["eps"] if eps is None else eps)
    methods, figure = {}, {"tokens": [], "methods": {}}
    shown = int(config.get("figure_sentences", 0))
    ids, mask = evaluated.input_ids[:shown], evaluated.attention_mask[:shown]
    figure["tokens"] = [bench.tokenizer.convert_ids_to_tokens(row[m.bool()].tolist()) for row, m in zip(ids, mask)]
    for name, per_task in masks:
        init, options = fit_arguments(config, eps, seed, per_task)
        explainer = DiffMask(bench.model, mode="heads", per_task=per_task, **init)
        start = time.perf_counter()
        with quiet_warnings():
            history = explainer.fit(train.loader(batch_size, shuffle=True, seed=seed, sort_by_length=True),
                                    **grouped_options(options))
        fit_seconds = time.perf_counter() - start
        result = {**score_heads(explainer, evaluated, batch_size), **fit_outcome(explainer, history)}
        result["fit_seconds"] = fit_seconds
        if per_task:
            result["refit_seconds"] = refit_seconds(bench.model, evaluated, init, options,
                                                    int(config.get("refit_sentences", 1)))
        methods[name] = result
        if shown:
            figure["methods"][name] = explainer.attribute(ids, additional_forward_args=(mask,), layer=None).tolist()
        log_to_stderr(verbose, f"[components] sst {name}: fit {fit_seconds:.0f} s, verdicts "
                               + ", ".join(f"{k}: {v}" for k, v in result["verdicts"].items()))
    return {"model": {k: v for k, v in bench.model_info.items() if k != "history"},
            "train_sentences": len(train), "eval_sentences": len(evaluated), "eps": eps, "methods": methods,
            "figure": figure}


def fit_arguments(config: Mapping[str, Any], eps: float, seed: int,
                  per_task: bool) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    r"""The constructor's and fit's arguments of one mask: fit's defaults with
    the part's eps, seed, cap and precision, then ``config["fit"]`` (its
    constructor options apart); the per-task mask's lr is :data:`PER_TASK_LR`."""
    changed = dict(config.get("fit") or {})
    # the paper's L0, as when the report was made (fit_presets.PAPER_L0)
    init = {**PAPER_L0, **{key: changed.pop(key) for key in list(changed) if key in CONSTRUCTOR_OPTIONS}}
    options: Dict[str, Any] = {"eps": eps, "seed": seed, "verbose": False, "max_steps": config.get("max_steps"),
                               "precision": config.get("precision", "float32"), **changed}
    if per_task:
        options["lr"] = PER_TASK_LR
    return init, options


def merge_sst(parts: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    r"""One result of :func:`run_sst`'s parts, each of some masks (the first
    part's model, sentences and eps, which every part shares)."""
    merged: Dict[str, Any] = {**parts[0], "methods": {}, "figure": {**parts[0]["figure"], "methods": {}}}
    for part in parts:
        merged["methods"].update(part["methods"])
        merged["figure"]["methods"].update(part["figure"]["methods"])
    return merged


def score_heads(explainer: DiffMask, data: Any, batch_size: int) -> Dict[str, Any]:
    r"""Per block: heads kept per sentence (mean, std) and, for a block-wise
    mask, agreement, KL and verdict; with every block's kept heads at once (a
    joint mask's verdict there); attribution seconds per sentence."""
    kept: Dict[int, List[Tensor]] = {}
    agree: Dict[int, List[Tensor]] = {}
    kls: Dict[int, List[Tensor]] = {}
    joint_agree, joint_kl, seconds = [], [], 0.0
    for ids, mask in data.loader(batch_size, shuffle=False):
        start = time.perf_counter()
        explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
        seconds += time.perf_counter() - start
        with torch.no_grad():
            masked = explainer.masked_forward_layers(ids, (mask,))
        for k, heads in _heads_per_block(explainer, masked).items():
            kept.setdefault(k, []).append(heads)
        if not explainer.joint:
            for k, (_, logits, original) in masked.items():
                agree.setdefault(k, []).append((logits.argmax(-1) == original.argmax(-1)).float())
                kls.setdefault(k, []).append(example_kl(log_probs(original), log_probs(logits)))
        same, kl = _every_block(explainer, ids, mask, masked)
        joint_agree.append(same)
        joint_kl.append(kl)
    blocks = {}
    for k in sorted(kept):
        heads = torch.cat(kept[k])
        blocks[str(k)] = {"heads_kept": float(heads.mean()), "heads_kept_std": float(heads.std())}
        if not explainer.joint:
            blocks[str(k)].update({"agreement": float(torch.cat(agree[k]).mean()),
                                   "kl": float(torch.cat(kls[k]).mean()),
                                   "verdict": explainer.convergence.get(k, {}).get("status", "-")})
    count = len(torch.cat(joint_agree))
    verdicts = {k: v["status"] for k, v in explainer.convergence.items()}
    return {"blocks": blocks, "verdicts": verdicts, "joint": explainer.joint,
            "every_block_agreement": float(torch.cat(joint_agree).mean()),
            "every_block_kl": float(torch.cat(joint_kl).mean()),
            "every_block_verdict": verdicts.get(0, "-") if explainer.joint else "-",
            "attribute_seconds": seconds / max(count, 1)}


def _heads_per_block(explainer: DiffMask, masked: Mapping[int, Tuple[Tensor, Tensor, Tensor]]) -> Dict[int, Tensor]:
    r"""Per block 1..L, the (B,) count of kept heads of each sentence (a joint
    mask's gates are every block's, concatenated in block order)."""
    if not explainer.joint:
        return {k: gates.sum(-1).float() for k, (gates, _, _) in masked.items()}
    gates = masked[0][0]
    per_block = gates.reshape(gates.shape[0], explainer.num_layers, -1).unbind(1)
    return {k + 1: block.sum(-1).float() for k, block in enumerate(per_block)}


def _every_block(explainer: DiffMask, ids: Tensor, mask: Tensor,
                 masked: Mapping[int, Tuple[Tensor, Tensor, Tensor]]) -> Tuple[Tensor, Tensor]:
    r"""Agreement and KL, per sentence, with every block's kept heads at once."""
    original, kept = every_block_forward(explainer, ids, mask, masked)
    return (kept.argmax(-1) == original.argmax(-1)).float(), example_kl(log_probs(original), log_probs(kept))


def refit_seconds(model: torch.nn.Module, data: Any, init: Mapping[str, Any], options: Mapping[str, Any],
                  sentences: int) -> float:
    r"""The per-task mask refitted on one sentence alone (its cost per input),
    mean over ``sentences`` (``init``, ``options``: the constructor's and fit's
    arguments)."""
    seconds = []
    for row in range(min(sentences, len(data))):
        one = data.subset(torch.tensor([row]))
        explainer = DiffMask(model, mode="heads", per_task=True, **init)
        start = time.perf_counter()
        with quiet_warnings():
            explainer.fit(one.loader(1, shuffle=False), **grouped_options(copy.deepcopy(dict(options))))
        seconds.append(time.perf_counter() - start)
    return statistics.fmean(seconds) if seconds else float("nan")
