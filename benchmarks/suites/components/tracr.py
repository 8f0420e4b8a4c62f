r"""
The components suite's tracr part: component masks against a ground truth that
no one here wrote, the heads and MLP units tracr placed each program's
computations in.

For every program (tracr compiles it, :mod:`benchmarks.tasks.tracr_models`
converts it) and both kinds of component, three methods score every component
for every held-out input:

- amortised DiffMask (``DiffMask(mode=kind)``: a probe reads each input), fitted
  once on the training inputs with fit's defaults;
- the per-task mask (``per_task=True``: one mask for every input, Subnetwork
  Probing), at lr 0.03 (fit's 3e-3 moves a bias too slowly, see
  ``docs/guide/components.md``);
- attribution patching (:class:`~captum_diffmask.methods.AttributionPatching`).

Closed components are replaced by zeros, fixed (zero ablation: an unused
component outputs zero, and "used" means non-zero weights). The model's read-out
is tracr's output space, one-hot, scaled by 10 as logits, so that the decoded
token has probability >= 0.99 and a changed token costs KL of about 10 at its
position. Per input, the ROC AUC of the scores against the used components
(those of every block together), and against those used *and active on the
input* (a head whose output, an MLP unit whose activation, is non-zero at a real
position: a per-input mask can need no more); the mean over inputs. For the masks
also the KL of the model with every block's kept components at once (each block
was fitted with the others intact), and the cost: fit seconds, attribution
seconds per input, and the per-task mask refitted on one input. Every fit runs
to fit's own verdict or to ``max_steps``; each block's verdict is reported.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from benchmarks.fit_presets import PAPER_L0
from benchmarks.tasks.tracr_models import (
    compile_program, convert, DISTINCT_TOKENS, PROGRAMS, used_components, weights_of,
)
from captum_diffmask import DiffMask
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.methods import AttributionPatching
from captum_diffmask.model.components import gate_components
from captum_diffmask.model.divergences import example_kl, log_probs

#: The programs scored by default: each leaves some heads and units unused
#: (the development programs, on which settings were chosen, are not among them).
DEFAULT_PROGRAMS = ("reverse", "sort", "sort_freq")
#: The read-out's scale: tracr's one-hot output space times this are the logits.
LOGIT_SCALE = 10.0
#: The per-task mask's learning rate (a bias moves about lr a step under Adam).
PER_TASK_LR = 0.03
#: The options of a variant that go to ``DiffMask``'s constructor (the others to ``fit``).
CONSTRUCTOR_OPTIONS = ("joint", "init_bias", "temperature", "stretch", "probe_hidden_size", "l0")
#: The kinds of component, as ``DiffMask``'s modes name them.
KINDS = ("heads", "units")


def roc_auc(scores: np.ndarray, truth: np.ndarray) -> float:
    r"""The ROC AUC of ``scores`` against the boolean ``truth`` (ties count
    half): the chance that a used component scores above an unused one."""
    positive, negative = scores[truth], scores[~truth]
    if not len(positive) or not len(negative):
        return float("nan")
    above = (positive[:, None] > negative[None, :]).sum() + 0.5 * (positive[:, None] == negative[None, :]).sum()
    return float(above / (len(positive) * len(negative)))


def random_inputs(model: Any, name: str, count: int, seed: int) -> Tuple[Tensor, Tensor]:
    r"""(count, T) ids and padding mask: BOS and 1 .. T - 1 tokens drawn uniformly."""
    _, vocabulary, length = PROGRAMS[name]
    rng = np.random.default_rng(seed)
    ids = torch.full((count, length), model.vocabulary["compiler_pad"])
    mask = torch.zeros(count, length, dtype=torch.long)
    for row in range(count):
        size = int(rng.integers(2, length + 1))
        if name in DISTINCT_TOKENS:
            picks = rng.permutation(len(vocabulary))[: size - 1]
        else:
            picks = rng.integers(len(vocabulary), size=size - 1)
        ids[row, :size] = model.encode(["BOS"] + [vocabulary[i] for i in picks])[0]
        mask[row, :size] = 1
    return ids, mask


def scaled_read_out(model: torch.nn.Module) -> Any:
    r"""``forward_func``: the converted model's output space times :data:`LOGIT_SCALE`, as logits."""
    return lambda ids, mask: LOGIT_SCALE * model(ids, mask)


def _zeros(explainer: Any) -> Dict[int, Tensor]:
    return {site.layer: torch.zeros(site.count, site.width) for site in explainer.components}


def every_block_forward(explainer: DiffMask, ids: Tensor, mask: Tensor,
                        masked: Mapping[int, Tuple[Tensor, Tensor, Tensor]]) -> Tuple[Tensor, Tensor]:
    r"""
    The model's logits, and those with every block's deterministic gates at once
    (``masked``: :meth:`DiffMask.masked_forward_layers`; a joint mask's layer 0
    is that already), closed components replaced by the learned baselines.

    Returns:
        *tuple* ``(original, kept)`` logits.
    """
    original = next(iter(masked.values()))[2].detach()  # the capture pass's, shared by every layer
    if 0 in masked:  # the joint mask: its masked pass gated every block at once already
        return original, masked[0][1].detach()
    gates = {f"{explainer.mode}.{k}": g for k, (g, _, _) in masked.items()}
    baselines = {f"{explainer.mode}.{k}": explainer.learned_baseline(k) for k in masked}
    with torch.no_grad(), gate_components(explainer.components, gates, baselines):
        kept = explainer.model_forward(ids, (mask,))
    return original, kept


def kept_kl(explainer: DiffMask, ids: Tensor, mask: Tensor) -> float:
    r"""The mean KL of the model with every block's deterministic gates at once."""
    original, kept = every_block_forward(explainer, ids, mask, explainer.masked_forward_layers(ids, (mask,)))
    return float(example_kl(log_probs(original), log_probs(kept)).mean())


def fit_outcome(explainer: DiffMask, history: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    r"""What a component fit ended with: ``steps`` per fitted layer (a joint
    mask has one, layer 0), and per fitted layer its verdict (``verdicts``) and
    the multiplier it ended at (``multipliers``), each ``{layer: value}``."""
    assert explainer.lambdas is not None
    layers = sorted(explainer.convergence)
    return {"steps": int(sum(row["steps"] for row in history)) // max(len(layers), 1),
            "verdicts": {k: explainer.convergence[k]["status"] for k in layers},
            "multipliers": {k: float(explainer.lambdas(k).detach()) for k in layers}}


def kind_options(options: Mapping[str, Any], kind: str) -> Dict[str, Any]:
    r"""A variant's options for one kind: the shared ones, then those under the
    kind's own key (``"heads"`` or ``"units"``), which win."""
    shared = {key: value for key, value in options.items() if key not in KINDS}
    return {**shared, **dict(options.get(kind) or {})}


def score_mask(model: torch.nn.Module, kind: str, per_task: bool, train: List[Tuple[Tensor, Tensor]],
               held: Tuple[Tensor, Tensor], seed: int, max_steps: Optional[int],
               fit_options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    r"""One mask fitted on ``train`` (fit's defaults, ``fit_options`` changed; those
    that name a constructor argument, as ``joint``, go to the constructor) and
    read on the held-out inputs."""
    changed = dict(fit_options or {})
    # the paper's L0, as when the report was made (fit_presets.PAPER_L0)
    init = {**PAPER_L0, **{key: changed.pop(key) for key in list(changed) if key in CONSTRUCTOR_OPTIONS}}
    explainer = DiffMask(model, mode=kind, forward_func=scaled_read_out(model), padding_mask_arg=0, output="all",
                         per_task=per_task, **init)
    options: Dict[str, Any] = {"init_baseline": _zeros(explainer), "lr_baseline": 0.0, "seed": seed, "verbose": False}
    if per_task:
        options["lr"] = PER_TASK_LR
    if max_steps is not None:
        options["max_steps"] = max_steps
    options.update(changed)
    start = time.perf_counter()
    with quiet_warnings():
        history = explainer.fit(train, **grouped_options(options))
    fit_seconds = time.perf_counter() - start
    ids, mask = held
    start = time.perf_counter()
    scores = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    attribute_seconds = (time.perf_counter() - start) / ids.shape[0]
    return {"scores": scores, "fit_seconds": fit_seconds, "attribute_seconds": attribute_seconds,
            **fit_outcome(explainer, history),
            "kept_kl": kept_kl(explainer, ids, mask), "kept_share": float((scores > 0.5).float().mean())}


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    r"""Silences the fits' warnings (their verdicts are in the results)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def active_components(model: torch.nn.Module, ids: Tensor, mask: Tensor, tolerance: float = 1e-6) -> Dict[str, Tensor]:
    r"""
    The components each input makes use of: a head whose output (before the
    output projection), an MLP unit whose activation, is non-zero at one of the
    input's real positions.

    Returns:
        *dict*: ``heads`` (B, L, H) and ``units`` (B, L, U) bool.
    """
    seen: Dict[str, List[Tensor]] = {"heads": [], "units": []}
    real = mask.bool()
    hooks = []
    for layer in model.layers:
        for kind, module in (("heads", layer.attention.heads), ("units", layer.mlp.units)):
            def record(_module: Any, _inputs: Any, output: Tensor, kind: str = kind) -> None:
                size = output.abs() if kind == "units" else output.abs().amax(-1)  # (B, T, count)
                seen[kind].append(((size > tolerance) & real.unsqueeze(-1)).any(1))
            hooks.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            model(ids, mask)
    finally:
        for hook in hooks:
            hook.remove()
    return {kind: torch.stack(values, 1) for kind, values in seen.items()}


def aucs_per_input(scores: np.ndarray, truth: np.ndarray) -> List[float]:
    r"""Per input (rows of ``scores``, (N, C)), the ROC AUC against ``truth``, (C,) or (N, C)."""
    rows = np.broadcast_to(truth, scores.shape)
    return [roc_auc(row, labels) for row, labels in zip(scores, rows)]


def idle_separation(scores: np.ndarray, used: np.ndarray, active: np.ndarray) -> Dict[str, float]:
    r"""
    Whether a method tells the used components that are idle on an input apart
    from the unused ones: on that input the two have the same effect (none), so
    a per-input mask is given no reason to rank one above the other; only what it
    shares across inputs can.

    Args:

        scores (np.ndarray): (N, C), each input's scores.
        used (np.ndarray): (C,) bool, the components the program uses.
        active (np.ndarray): (N, C) bool, the used components active on each input.

    Returns:
        *dict*: ``auc_idle_unused`` (mean over inputs of the ROC AUC of the idle
        used components against the unused ones; 0.5: no better than chance), and
        the median score of the active, the idle and the unused components.
    """
    idle = used[None] & ~active
    unused = np.broadcast_to(~used[None], scores.shape)
    aucs = [roc_auc(row[i | u], i[i | u]) for row, i, u in zip(scores, idle, unused)]

    def median(where: np.ndarray) -> float:
        return float(np.median(scores[where])) if where.any() else float("nan")

    return {"auc_idle_unused": mean_defined(aucs), "median_active": median(active), "median_idle": median(idle),
            "median_unused": median(unused)}


def against_truth(scores: Tensor, used: np.ndarray, active: np.ndarray) -> Dict[str, Any]:
    r"""
    One method's scores against the program's components.

    Args:

        scores (Tensor): (N, L, count), each held-out input's scores.
        used (np.ndarray): (L, count) bool, the components the program uses.
        active (np.ndarray): (N, L, count) bool, the components active on each input.

    Returns:
        *dict*: ``auc`` and ``auc_min`` (per input against the used components:
        the mean and the minimum), ``auc_active`` (against the used components
        active on the input), ``active`` (how many, mean over inputs), ``inputs``,
        the mean scores of the used and the unused components, and
        :func:`idle_separation`'s measures.
    """
    flat = scores.reshape(scores.shape[0], -1).numpy()
    truth = used.reshape(-1)
    now = (active & used[None]).reshape(flat.shape[0], -1)
    aucs = aucs_per_input(flat, truth)
    return {"active": float(now.sum(1).mean()), "auc": mean_defined(aucs), "auc_min": min(a for a in aucs if a == a),
            "auc_active": mean_defined(aucs_per_input(flat, now)), "inputs": len(aucs),
            "mean_score_used": float(flat[:, truth].mean()), "mean_score_unused": float(flat[:, ~truth].mean()),
            **idle_separation(flat, truth, now)}


def mean_defined(values: List[float]) -> float:
    kept = [v for v in values if v == v]  # an input with no active or no idle component has no AUC
    return statistics.fmean(kept) if kept else float("nan")


def score_program(name: str, seed: int, config: Mapping[str, Any],
                  kinds: Sequence[str] = KINDS, everything: bool = True) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    r"""
    The methods on ``kinds`` of component of one program.

    Args:

        name (str): a key of :data:`~benchmarks.tasks.tracr_models.PROGRAMS`.
        seed (int): the inputs' and the fits' seed.
        config (Mapping): ``train_batches``, ``batch_size``, ``held_out``,
                    ``max_steps`` (None: fit's own budget), ``refit_inputs``,
                    ``figure_inputs`` (how many held-out inputs' scores to keep)
                    and ``variants``.
        kinds (sequence of str, optional): of :data:`KINDS`. Default: both
        everything (bool, optional): every method; False: the variants of
                    amortised DiffMask alone (for more seeds). Default: True

    Returns:
        *tuple* ``(lines, figure)``: a line per kind and method; the truth and
        the first inputs' scores, (inputs, L, count) per kind and method.
    """
    assembled = compile_program(name)
    weights = weights_of(assembled)
    if not weights.categorical:
        raise ValueError(f"programs: {name} has a numerical output, which has no KL; choose a categorical one")
    model = convert(assembled)
    used = used_components(weights)
    train = [random_inputs(model, name, int(config["batch_size"]), seed * 1000 + b) for b in range(int(config["train_batches"]))]
    held = random_inputs(model, name, int(config["held_out"]), seed * 1000 + 999)
    active = active_components(model, *held)
    shown = int(config.get("figure_inputs", 0))
    names = {index: str(token) for token, index in model.vocabulary.items()}
    tokens = [[names[int(i)] for i in row[m.bool()]] for row, m in zip(held[0][:shown], held[1][:shown])]
    lines: List[Dict[str, Any]] = []
    figure: Dict[str, Any] = {"program": name, "tokens": tokens, "kinds": {}}
    for kind in kinds:
        truth = used[kind]
        results = _kind_results(model, name, kind, train, held, seed, config, everything)
        refits = results.pop("refit_seconds", float("nan"))
        figure["kinds"][kind] = {"used": truth.astype(int).tolist(), "methods": {}}
        for method, result in results.items():
            scores = result.pop("scores")
            figure["kinds"][kind]["methods"][method] = scores[:shown].tolist()
            lines.append({
                "program": name, "kind": kind, "method": method, "seed": seed, "components": int(truth.size),
                "used": int(truth.sum()), **against_truth(scores, truth, active[kind].numpy()),
                "per_task_refit_seconds": refits, **result,
            })
    return lines, figure


def _kind_results(model: torch.nn.Module, name: str, kind: str, train: List[Tuple[Tensor, Tensor]],
                  held: Tuple[Tensor, Tensor], seed: int, config: Mapping[str, Any],
                  everything: bool = True) -> Dict[str, Any]:
    r"""The methods' scores (held-out inputs, L, count) and costs on one kind
    (``everything`` False: the variants alone)."""
    steps = config.get("max_steps")
    variants = {variant: score_mask(model, kind, False, train, held, seed, steps, kind_options(options, kind))
                for variant, options in (config.get("variants") or {}).items()}  # amortised DiffMask, options changed
    if not everything:
        return variants
    results: Dict[str, Any] = {
        "DiffMask": score_mask(model, kind, False, train, held, seed, steps),
        "per-task mask": score_mask(model, kind, True, train, held, seed, steps),
        **variants,
    }
    patching = AttributionPatching(model, kind=kind, forward_func=scaled_read_out(model), padding_mask_arg=0,
                                   output="all")
    start = time.perf_counter()
    scores = patching.attribute(held[0], additional_forward_args=(held[1],))
    results["attribution patching"] = {"scores": scores, "attribute_seconds": (time.perf_counter() - start) / held[0].shape[0]}
    one = [random_inputs(model, name, 1, seed * 1000 + 500 + i) for i in range(int(config.get("refit_inputs", 1)))]
    refits = [score_mask(model, kind, True, [example], example, seed, steps)["fit_seconds"] for example in one]
    results["refit_seconds"] = statistics.fmean(refits) if refits else float("nan")
    return results
