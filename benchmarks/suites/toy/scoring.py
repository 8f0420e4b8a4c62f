"""The toy suite's numbers: a method's scores against the ground truth (JS, KL), their means over seeds, and the targets met."""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from benchmarks.methods import MethodContext
from benchmarks.records import cached
from benchmarks.suites.toy.settings import PAPER
from captum_diffmask.evaluation.ground_truth import js_to_ground_truth, kl_to_ground_truth, summarize
from captum_diffmask.evaluation.toy_task import (
    accuracy, generate_toy_data, toy_ground_truth, toy_sites, ToyData, ToyModel, train_toy_model,
)

#: Added to a data seed for the examples a toy model stops on (no data set of
#: this project uses seeds near it).
STOPPING_SEED_OFFSET = 7919


# ----------------------------------------------------------------- pieces
def load_toy_model(
    config: Mapping[str, Any], seed: int, train: ToyData, valid: ToyData, verbose: bool
) -> Tuple[ToyModel, Dict[str, Any]]:
    r"""The toy model for ``seed``: from the cache when this configuration was
    trained before, else trained (and cached). It stops on examples of its own
    (:func:`stopping_data`), never on ``valid``, the held-out set the suites
    score; its info gives the accuracy on both."""
    model_cfg = dict(config["model"])
    key = {"task": "toy-model", "format": 1, "data": dict(config["data"]), "model": model_cfg, "seed": seed}

    def build() -> Dict[str, Any]:
        start = time.perf_counter()
        # its bar is on whenever verbose; keep logs clean when not on a terminal
        show = verbose and sys.stderr.isatty()
        model, stopping = train_toy_model(train, stopping_data(config["data"], seed), seed=seed, verbose=show,
                                          **model_cfg)
        return {
            "state_dict": model.state_dict(),
            "stopping_accuracy": float(stopping),
            "vocab_size": int(model.embed_input.num_embeddings),
            "train_seconds": time.perf_counter() - start,
        }

    payload, hit = cached("toy-model", key, build, use_cache=bool(config.get("cache", True)))
    model = ToyModel(payload["vocab_size"], embedding_dim=model_cfg["embedding_dim"], hidden_size=model_cfg["hidden_size"])
    model.load_state_dict(payload["state_dict"])
    model.eval()
    info = {"seed": seed, "accuracy": accuracy(model, valid), "stopping_accuracy": payload["stopping_accuracy"],
            "cached": hit, "train_seconds": payload["train_seconds"]}
    return model, info


def stopping_data(data: Mapping[str, Any], seed: int) -> ToyData:
    r"""The examples a toy model of data seed ``seed`` stops on and is selected
    by: ``data["stopping_examples"]`` drawn as the task's data (``vocab_size``,
    ``max_length``) under the seed plus :data:`STOPPING_SEED_OFFSET`, apart
    from the training and held-out sets, so no model is chosen on what a suite
    scores."""
    return generate_toy_data(int(data["stopping_examples"]), int(data["vocab_size"]), int(data["max_length"]),
                             seed=seed + STOPPING_SEED_OFFSET)


def score(scores: torch.Tensor, data: ToyData) -> Dict[str, Any]:
    r"""JS and KL of ``scores`` (N, T) to the toy ground truth, summarised over the
    examples whose ground truth is not empty."""
    truth = toy_ground_truth(data.ids, data.query, data.mask)
    has_truth = truth.sum(-1) > 0
    js = js_to_ground_truth(scores, truth, data.mask)
    kl = kl_to_ground_truth(scores, truth, data.mask)
    js_summary, kl_summary = summarize(js), summarize(kl)
    return {
        "js": js_summary["mean"],
        "js_std_examples": js_summary["std"],
        "kl": kl_summary["mean"],
        "kl_std_examples": kl_summary["std"],
        "kl_finite": kl_summary["finite_mean"],
        "kl_inf_share": kl_summary["inf_share"],
        "scored": js_summary["count"],
        # rows with a ground truth whose score is NaN (a method returned NaN)
        "unscored": int((torch.isnan(js) & has_truth).sum()),
    }


def pick_example(data: ToyData) -> int:
    r"""A held-out example that shows the task well, like the paper's: as long as
    possible, a close call (one more n than m, at least two n) and at least three
    other digits; the first such one (then relaxing to any unequal counts)."""
    lengths = data.mask.sum(1)
    count_n = ((data.ids == data.query[:, :1]) & data.mask).sum(1)
    count_m = ((data.ids == data.query[:, 1:]) & data.mask).sum(1)
    others = lengths - count_n - count_m
    base = (count_n >= 2) & (count_m >= 1) & (others >= 3)
    for good in (base & (count_n == count_m + 1), base & (count_n != count_m)):
        for length in sorted(set(lengths.tolist()), reverse=True):
            chosen = torch.nonzero(good & (lengths == length)).flatten()
            if chosen.numel():
                return int(chosen[0])
    return int(torch.argmax(lengths))


def seed_data(config: Mapping[str, Any], seed: int) -> Tuple[ToyData, ToyData]:
    r"""The seed's training and held-out sets (the held-out set cut to
    ``eval_examples`` when set)."""
    data_cfg = config["data"]
    data = generate_toy_data(data_cfg["num_examples"], data_cfg["vocab_size"], data_cfg["max_length"], seed=seed)
    train, valid = data.split(data_cfg["holdout"], seed=seed)
    if config.get("eval_examples"):
        valid = valid.subset(torch.arange(min(int(config["eval_examples"]), len(valid))))
    return train, valid


def aggregate(records: List[Dict[str, Any]], speed: Optional[Dict[str, Any]], options: Mapping[str, Any]) -> Dict[str, Any]:
    r"""One method's numbers over seeds: the mean of the per-seed means, the std
    of the per-seed means (0 for one seed), and the per-example std averaged over
    seeds."""
    ok = [r for r in records if "error" not in r]
    result: Dict[str, Any] = {"options": dict(options), "per_seed": records}
    if not ok:
        first_error = records[0] if records else {}
        result.update({"status": first_error.get("status", "failed"), "error": first_error.get("error", "not run")})
        for key in ("js", "kl", "js_std", "kl_std", "seconds_per_example", "ratio_to_forward"):
            result[key] = math.nan
        return result

    def mean_std(key: str) -> Tuple[float, float]:
        values = [float(r[key]) for r in ok]
        if any(math.isinf(v) for v in values):
            return math.inf, math.inf
        if any(math.isnan(v) for v in values):
            return math.nan, math.nan
        return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

    result["status"] = "ok"
    result["js"], result["js_std"] = mean_std("js")
    result["kl"], result["kl_std"] = mean_std("kl")
    for key in ("js_std_examples", "kl_std_examples", "kl_finite", "kl_inf_share", "setup_seconds", "attribute_seconds"):
        values = [float(r[key]) for r in ok]
        result[key] = math.inf if any(math.isinf(v) for v in values) else statistics.fmean(values)
    result["unscored"] = int(sum(r["unscored"] for r in ok))
    result["seeds_ok"] = len(ok)
    failed = [r for r in records if "error" in r]
    if failed:
        result["error"] = f"failed on seeds {[r['seed'] for r in failed]}: {failed[0]['error']}"
    result["seconds_per_example"] = math.nan
    result["ratio_to_forward"] = math.nan
    if speed:
        result.update(speed)
    return result


# ---------------------------------------------------------------- checks
def checks(results: Mapping[str, Any], config: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""The issue's targets, evaluated on this run's numbers."""
    methods = results["methods"]
    out: List[Dict[str, Any]] = []
    ok = {n: r for n, r in methods.items() if r.get("status") == "ok"}
    dm = ok.get("DiffMask")
    if dm is not None:
        out.append({"target": "DiffMask JS <= 0.02", "value": f"{dm['js']:.4f}", "met": dm["js"] <= 0.02})
        others = {n: r["js"] for n, r in ok.items() if n != "DiffMask"}
        if others:
            best_other = min(others, key=others.get)
            out.append({"target": "DiffMask has the lowest JS", "value": f"next best: {best_other} {others[best_other]:.4f}",
                        "met": all(dm["js"] < v for v in others.values())})
        ratio = dm.get("ratio_to_forward", math.nan)
        out.append({"target": "DiffMask attribution <= 1.5x one forward pass", "value": f"{ratio:.2f}x",
                    "met": ratio <= 1.5})
        for name in ("IntegratedGradients", "PerSampleBottleneck"):
            other = ok.get(name)
            if other is None:
                continue
            steps = other["options"].get("n_steps", other["options"].get("steps"))
            factor = other.get("seconds_per_example", math.nan) / dm.get("seconds_per_example", math.nan)
            out.append({"target": f"DiffMask >= 100x faster than {name} ({steps} steps)",
                        "value": f"{factor:.0f}x", "met": factor >= 100})
    for name, paper in PAPER.items():
        if name == "DiffMask" or name not in ok:
            continue
        js = ok[name]["js"]
        out.append({"target": f"{name} JS within 0.06 of the paper's {paper['js']:.2f}", "value": f"{js:.4f}",
                    "met": abs(js - paper["js"]) <= 0.06})
    return out


def fmt_number(value: Any, digits: int = 4) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def method_context(model: ToyModel, train: ToyData, layer: int, seed: int, verbose: bool) -> MethodContext:
    return MethodContext(
        model=model,
        sites=lambda: toy_sites(model),
        padding_mask_arg=1,  # the toy model's extras are (query, mask)
        train_loader=lambda batch_size, s: train.loader(batch_size, shuffle=True, seed=s),
        layer=layer,
        seed=seed,
        verbose=verbose,
    )
