"""Several attribution methods side by side on the user's own model and batch.

:func:`compare` sets every method up (a fitted explainer as given, a name with its
options built here and, where it needs data, fitted within a stated budget), runs
each on the same batch at the same layer, times it against one forward pass of the
model, and returns a :class:`Comparison`: the scores, a Markdown table, the panel
figure and per-layer heatmaps, and a JSON-ready dict. The benchmark harness sets
its methods up with the same :func:`prepare_method`.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.evaluation.faithfulness import eraser_scores, plausibility, TokenEraser
from captum_diffmask.interface.comparison import Comparison, MethodResult, token_labels
from captum_diffmask.interface.verdicts import layer_verdicts
from captum_diffmask.methods.preparation import MethodSpec, prepare_method
from captum_diffmask.model.attribution import method_name, method_trait
from captum_diffmask.model.forward import Batch, format_additional_args, frozen, ModelForward
from captum_diffmask.model.inputs import check_token_ids
from captum_diffmask.model.texts import as_texts, encoding_word_ids, piece_words


# ------------------------------------------------------------------ compare
def compare(
    model: nn.Module,
    inputs: Union[Tensor, Mapping[str, Any]],
    methods: Sequence[MethodSpec],
    layer: Optional[int] = 0,
    additional_forward_args: Any = None,
    target: Any = None,
    train_data: Optional[Iterable[Batch]] = None,
    tokenizer: Any = None,
    tokens: Optional[Sequence[Sequence[str]]] = None,
    sites: Optional[Mapping[str, Any]] = None,
    padding_mask_arg: Union[int, str, None] = "auto",
    forward_func: Optional[Callable[..., Any]] = None,
    fit_steps: Optional[int] = 1000,
    seed: int = 0,
    errors: str = "raise",
    verbose: bool = False,
    metrics: Sequence[str] = (),
    rationales: Optional[Tensor] = None,
) -> Comparison:
    r"""
    Runs several attribution methods on the same batch of the user's model.

    Args:

        model (nn.Module): the analysed model.
        inputs (Tensor or Mapping): (B, T) token ids, or a mapping batch such as
                    a tokenizer's ``BatchEncoding`` (its ``input_ids``; its
                    ``attention_mask`` and ``token_type_ids`` as the model's other
                    arguments); or texts (a string, a list of strings, a
                    ``pathlib.Path`` of a file of them) with ``tokenizer``.
        methods (sequence): each an object with ``attribute`` (e.g. a fitted
                    :class:`DiffMask`), a registered name
                    (:func:`~captum_diffmask.methods.registry.registered_methods`), or
                    ``(name, options)``; see :func:`prepare_method`.
        layer (int, optional): the layer every method attributes at (0: the input
                    tokens; DiffMask's input mode reads it as depth). A DiffMask
                    also gives its every-layer scores, for the heatmaps.
                    Default: 0
        additional_forward_args (Any, optional): the model's other arguments
                    (e.g. ``(attention_mask,)``). Default: None
        target (optional): the class attributed by the methods that attribute
                    one (``uses_target``); the others keep the whole output and
                    are not given it. Default: None (the predicted class)
        train_data (iterable, optional): re-iterable training batches for the
                    methods the call fits (DiffMask, the bottleneck's statistics).
                    Default: None
        tokenizer (optional): labels the tokens (``convert_ids_to_tokens``).
        tokens (sequence, optional): the labels, (B, T), instead.
        sites, padding_mask_arg, forward_func: as in :class:`DiffMask`, for the
                    methods built by the call.
        fit_steps (int, optional): the step budget of each DiffMask fit the call
                    makes. Default: 1000
        seed (int, optional): seeds those fits. Default: 0
        errors (str, optional): ``"raise"`` a method's error, or ``"record"`` it
                    in its result and go on. Default: ``"raise"``
        verbose (bool, optional): progress bars. Default: False
        metrics (sequence of str, optional): faithfulness and plausibility scores
                    per method (:data:`METRICS`): ``"comprehensiveness"`` and
                    ``"sufficiency"`` (ERASER's, as AOPC over the top-k fractions of
                    :func:`~captum_diffmask.evaluation.faithfulness.eraser_scores`,
                    tokens removed by a zero input embedding; a method's ranking
                    of positions is used whatever site it scored),
                    ``"plausibility"`` (the average precision against
                    ``rationales``); each the mean over the batch. Default: ()
        rationales (Tensor, optional): (B, T) bool, the tokens humans marked, for
                    ``"plausibility"``. Default: None

    Returns:
        :class:`Comparison`.
    """
    _check_metrics(metrics, rationales)
    if errors not in ("raise", "record"):
        raise ValueError(f"errors must be 'raise' or 'record', got {errors!r}")
    model_forward = ModelForward(model, forward_func, padding_mask_arg)
    if _holds_text(inputs):
        if tokenizer is None:
            raise ValueError("inputs: texts need tokenizer= to turn them into token ids")
        inputs = tokenizer(as_texts(inputs, "inputs"), padding=True, return_tensors="pt")
    word_ids = encoding_word_ids(inputs)
    if isinstance(inputs, Mapping):  # a tokenizer's output, as every method's attribute takes it
        if additional_forward_args is not None:
            raise ValueError("additional_forward_args must be None when inputs is a mapping batch "
                             "(its attention_mask and token_type_ids are read from it)")
        inputs, additional_forward_args = model_forward.split_batch(inputs)
    ids, _ = check_token_ids(inputs)
    extra = format_additional_args(additional_forward_args)
    mask = model_forward.padding_mask(ids, extra)
    setup = dict(train_data=train_data, layer=layer, sites=sites, padding_mask_arg=padding_mask_arg,
                 forward_func=forward_func, fit_steps=fit_steps, seed=seed, verbose=verbose)
    results: Dict[str, MethodResult] = {}
    for method in methods:
        result = _run_one(method, model, ids, extra, target, setup, errors)
        name, number = result.name, 2
        while name in results:  # the same method twice, e.g. with other options
            name, number = f"{result.name} #{number}", number + 1
        result.name = name
        results[name] = result
    seconds = time_forward(model_forward, ids, extra)
    if metrics:
        eraser = TokenEraser(model, sites=sites, forward_func=forward_func, padding_mask_arg=padding_mask_arg)
        for result in results.values():
            if result.scores is not None:
                result.metrics = method_metrics(eraser, ids, extra, result.scores, mask, metrics, rationales, target)
    comparison = Comparison(results, token_labels(ids, tokenizer, tokens), mask, layer, seconds, list(metrics))
    if word_ids is not None and tokenizer is not None:
        comparison.word_ids = word_ids
        comparison.words = [piece_words(tokenizer, row, ids_of_row)
                            for row, ids_of_row in zip(comparison.tokens, word_ids)]
    return comparison


def _holds_text(inputs: Any) -> bool:
    return isinstance(inputs, (str, os.PathLike)) or (
        isinstance(inputs, (list, tuple)) and bool(inputs) and all(isinstance(t, str) for t in inputs))


#: The scores :func:`compare` can add per method (``metrics=``).
METRICS = ("comprehensiveness", "sufficiency", "plausibility")


def _check_metrics(metrics: Sequence[str], rationales: Optional[Tensor]) -> None:
    unknown = [m for m in metrics if m not in METRICS]
    if isinstance(metrics, str) or unknown:
        raise ValueError(f"metrics must be a list of {METRICS}, got {metrics!r}")
    if "plausibility" in metrics and rationales is None:
        raise ValueError("metrics: 'plausibility' needs rationales=, a (B, T) bool tensor of the marked tokens")


def method_metrics(
    eraser: TokenEraser, ids: Tensor, extra: Tuple[Any, ...], scores: Tensor, mask: Tensor,
    metrics: Sequence[str], rationales: Optional[Tensor], target: Any = None,
) -> Dict[str, float]:
    r"""
    One method's ``metrics`` (:data:`METRICS`) on the batch, each the mean over
    its examples (plausibility over those with a non-empty rationale).

    Returns:
        *dict* metric name -> float.
    """
    values: Dict[str, float] = {}
    if "comprehensiveness" in metrics or "sufficiency" in metrics:
        erased = eraser_scores(eraser, ids, scores, extra, target=target)
        for name in ("comprehensiveness", "sufficiency"):
            if name in metrics:
                values[name] = float(erased[f"aopc_{name}"].mean())
    if "plausibility" in metrics:
        assert rationales is not None
        auprc = plausibility(scores, rationales, mask)["auprc"]
        values["plausibility"] = float(auprc[~auprc.isnan()].mean()) if (~auprc.isnan()).any() else math.nan
    return values


def _run_one(
    method: MethodSpec, model: nn.Module, ids: Tensor, extra: Tuple[Any, ...], target: Any,
    setup: Mapping[str, Any], errors: str,
) -> MethodResult:
    options = dict(method[1]) if isinstance(method, tuple) and len(method) == 2 else {}
    name = method[0] if isinstance(method, tuple) else method if isinstance(method, str) else method_name(method)
    try:
        prepared = prepare_method(method, model, **setup)
        start = time.perf_counter()
        scores = prepared.attribute(ids, extra, setup["layer"], target)
        seconds = time.perf_counter() - start
        every = None
        explainer = prepared.explainer
        if setup["layer"] is not None and callable(getattr(explainer, "attributes_every_layer", None)) \
                and explainer.attributes_every_layer():  # every layer's scores where it can
            every = prepared.attribute(ids, extra, None)
    except Exception as error:  # noqa: BLE001 - recorded when asked to, else raised
        if errors == "raise":
            raise
        return MethodResult(str(name), None, error=f"{type(error).__name__}: {error}", options=options)
    if scores.dim() == 3:  # DiffMask's layer=None: the per-layer scores are the result
        every, scores = scores, scores.mean(-1)
    scored = explainer.scored(setup["layer"]) if callable(getattr(explainer, "scored", None)) else ""
    return MethodResult(prepared.name, scores, seconds, prepared.setup_seconds, every, None, options, prepared.info,
                        bool(method_trait(explainer, "scores_are_probabilities")), scored,
                        verdicts=layer_verdicts(explainer, range(int(getattr(explainer, "num_layers", -1)) + 1)))


def time_forward(model_forward: ModelForward, ids: Tensor, extra: Tuple[Any, ...], repeats: int = 5) -> float:
    r"""One forward pass of the batch, the median of ``repeats`` after one
    warm-up pass, in seconds (no gradients, the model in eval mode)."""
    times = []
    with frozen(model_forward.model), torch.no_grad():
        model_forward(ids, extra)
        for _ in range(repeats):
            start = time.perf_counter()
            model_forward(ids, extra)
            times.append(time.perf_counter() - start)
    return statistics.median(times)
