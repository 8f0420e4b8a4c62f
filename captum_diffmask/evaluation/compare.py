"""Several attribution methods side by side on the user's own model and batch.

:func:`compare` sets every method up (a fitted explainer as given, a name with its
options built here and, where it needs data, fitted within a stated budget), runs
each on the same batch at the same layer, times it against one forward pass of the
model, and returns a :class:`Comparison`: the scores, a Markdown table, the panel
figure and per-layer heatmaps, and a JSON-ready dict. The benchmark harness sets
its methods up with the same :func:`prepare_method`.
"""

from __future__ import annotations

import inspect
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor

from ..attribution import method_trait
from ..diffmask import DiffMask
from ..forward import Batch, check_token_ids, format_additional_args, frozen, ModelForward
from ..methods import (
    ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, PerSampleBottleneck, RandomAttribution,
    ReadoutBottleneck, REINFORCE,
)
from ..text import as_texts, encoding_word_ids, piece_words
from .faithfulness import eraser_scores, plausibility, TokenEraser
from .comparison import Comparison, MethodResult, token_labels

#: The library's methods, in the order tables list them.
LIBRARY_METHODS: Tuple[type, ...] = (DiffMask, IntegratedGradients, Occlusion, ExactErasure, PerSampleBottleneck,
                                     ReadoutBottleneck, Guan, PerExampleDiffMask, REINFORCE, RandomAttribution)
#: The library's methods by class name, as :func:`compare` takes them (each
#: describes itself: ``name()``, ``summary``, ``needs_data``, ``data_step``).
METHODS: Dict[str, type] = {cls.__name__: cls for cls in LIBRARY_METHODS}
#: A method for :func:`compare`: an object with ``attribute`` (fitted or not), a
#: name of :data:`METHODS`, or ``(name, options)``.
MethodSpec = Union[Any, str, Tuple[str, Mapping[str, Any]]]


@dataclass
class PreparedMethod:
    r"""
    A method ready to attribute, with what its setup cost.

    Attributes:
        name (str): the method's name in results.
        explainer (Any): the object whose ``attribute`` is called.
        attribute_kwargs (dict): options passed to every ``attribute`` call.
        setup_seconds (float): construction plus any fitting, in seconds.
        info (dict): what the setup reports (for a fit: its steps, last record and
                    per-layer convergence).
    """

    name: str
    explainer: Any
    attribute_kwargs: Dict[str, Any] = field(default_factory=dict)
    setup_seconds: float = 0.0
    info: Dict[str, Any] = field(default_factory=dict)

    def attribute(self, ids: Tensor, additional_forward_args: Any, layer: Optional[int], target: Any = None) -> Tensor:
        r"""The scores of ``ids`` at ``layer`` as a float tensor ((B, T), or
        (B, T, L + 1) for DiffMask's ``layer=None``); ``target`` is passed only to
        methods that attribute a class."""
        kwargs = dict(self.attribute_kwargs)
        if target is not None and method_trait(self.explainer, "uses_target"):
            kwargs["target"] = target
        result = self.explainer.attribute(ids, additional_forward_args=additional_forward_args, layer=layer, **kwargs)
        if isinstance(result, (tuple, list)) and len(result) == 1:
            result = result[0]
        if not isinstance(result, Tensor) or tuple(result.shape[:2]) != tuple(ids.shape):
            shape = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
            raise ValueError(f"{self.name}.attribute returned {shape}, expected scores of shape {tuple(ids.shape)}")
        return result.detach().float()


# --------------------------------------------------------------- option routing
def _parameters(fn: Optional[Callable[..., Any]]) -> Tuple[set, bool]:
    r"""Named keyword parameters of ``fn`` and whether it takes ``**kwargs``."""
    if fn is None:
        return set(), False
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return set(), False
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in signature.parameters.values() if p.kind in kinds}
    return names, any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())


def route_options(
    options: Mapping[str, Any], targets: Sequence[Tuple[str, Optional[Callable[..., Any]]]]
) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    r"""
    Sends each option to the first target whose signature names it (then to the
    first that takes ``**kwargs``), so that a method's options can be given as one
    flat dict whatever the method's split into constructor, fit and attribute.

    Args:

        options (Mapping): flat options.
        targets (sequence): ``(label, callable or None)`` in priority order.

    Returns:
        *tuple* ``(routed, ignored)``: ``routed[label]`` is a kwargs dict per
        target; ``ignored`` the option names that no target takes.
    """
    signatures = [(label, *_parameters(fn)) for label, fn in targets]
    routed: Dict[str, Dict[str, Any]] = {label: {} for label, _ in targets}
    ignored: List[str] = []
    for key, value in options.items():
        label = next((lab for lab, names, _ in signatures if key in names), None)
        if label is None:
            label = next((lab for lab, _, var_kw in signatures if var_kw), None)
        if label is None:
            ignored.append(key)
        else:
            routed[label][key] = value
    return routed, ignored


# -------------------------------------------------------------------- setup
def prepare_method(
    method: MethodSpec,
    model: nn.Module,
    train_data: Optional[Iterable[Batch]] = None,
    layer: Optional[int] = 0,
    sites: Optional[Mapping[str, Any]] = None,
    padding_mask_arg: Union[int, str, None] = "auto",
    forward_func: Optional[Callable[..., Any]] = None,
    fit_steps: Optional[int] = 1000,
    seed: int = 0,
    verbose: bool = False,
) -> PreparedMethod:
    r"""
    Sets one method up for ``model``.

    Args:

        method: an object with ``attribute`` (used as given; an unfitted
                    :class:`DiffMask` is fitted, a bottleneck without statistics
                    for ``layer`` gets them), a name of :data:`METHODS`, or
                    ``(name, options)`` with one flat dict of options, each routed
                    to the constructor, ``fit`` / ``fit_statistics`` or
                    ``attribute``, whichever names it.
        model (nn.Module): the analysed model.
        train_data (iterable, optional): re-iterable batches (as
                    :meth:`DiffMask.fit` takes them) for the methods that learn
                    from data: DiffMask's fit and the bottleneck's statistics.
                    Default: None
        layer (int, optional): the layer the method will attribute at; a DiffMask
                    built here is fitted at it only (every layer when None).
                    Default: 0
        sites, padding_mask_arg, forward_func: as in :class:`DiffMask`, for the
                    methods built here.
        fit_steps (int, optional): the budget of a DiffMask fit made here: its
                    ``max_steps`` unless the options set one (None: no cap beyond
                    ``epochs``). Default: 1000
        seed (int, optional): seeds a fit made here. Default: 0
        verbose (bool, optional): progress bars. Default: False

    Returns:
        *PreparedMethod*.
    """
    name, explainer, options = _resolve(method)
    start = time.perf_counter()
    if explainer is None:
        common = {"sites": sites, "padding_mask_arg": padding_mask_arg, "forward_func": forward_func}
        explainer, options, ignored = _construct(name, model, options, common, verbose)
    else:
        ignored = []
    routed, more_ignored = route_options(options, _fit_targets(explainer))
    if ignored + more_ignored:
        raise ValueError(
            f"methods: {name} takes no option {sorted(ignored + more_ignored)} (not in its constructor, "
            f"fit or attribute: a misspelt name?)"
        )
    info = _fit_if_needed(explainer, routed, train_data, layer, fit_steps, seed, verbose)
    return PreparedMethod(name, explainer, routed["attribute"], time.perf_counter() - start, info)


def _resolve(method: MethodSpec) -> Tuple[str, Any, Dict[str, Any]]:
    if isinstance(method, str):
        method = (method, {})
    if isinstance(method, tuple) and len(method) == 2 and isinstance(method[0], str):
        name, options = method
        if name not in METHODS:
            raise ValueError(f"methods: unknown method {name!r}; the library's are {sorted(METHODS)}")
        if not isinstance(options, Mapping):
            raise TypeError(f"methods: the options of {name} must be a dict, got {type(options).__name__}")
        return name, None, dict(options)
    if not callable(getattr(method, "attribute", None)):
        raise TypeError(f"methods: expected a name, (name, options) or an object with attribute(), got {method!r}")
    return type(method).__name__, method, {}


def _construct(
    name: str, model: nn.Module, options: Dict[str, Any], common: Mapping[str, Any], verbose: bool
) -> Tuple[Any, Dict[str, Any], List[str]]:
    r"""Builds the named method; returns it, the options left for fit and
    attribute, and those no signature takes."""
    cls = METHODS[name]
    init_names, _ = _parameters(cls.__init__)
    kwargs = {k: v for k, v in common.items() if k in init_names and v is not None}
    targets = [("init", cls.__init__)] + _fit_targets(cls)
    routed, ignored = route_options(options, targets)
    if "verbose" not in options:  # the caller's verbosity wherever the method takes one
        for label, fn in (("init", cls.__init__), ("attribute", cls.attribute)):
            if "verbose" in _parameters(fn)[0]:
                routed[label]["verbose"] = verbose
    explainer = cls(model, **kwargs, **routed.pop("init"))
    rest = {key: value for part in routed.values() for key, value in part.items()}
    return explainer, rest, ignored


def _fit_targets(explainer: Any) -> List[Tuple[str, Optional[Callable[..., Any]]]]:
    step = method_trait(explainer, "data_step")
    return [("data", getattr(explainer, step, None) if step else None),
            ("attribute", getattr(explainer, "attribute", None))]


def _fit_if_needed(
    explainer: Any, routed: Mapping[str, Dict[str, Any]], train_data: Optional[Iterable[Batch]],
    layer: Optional[int], fit_steps: Optional[int], seed: int, verbose: bool,
) -> Dict[str, Any]:
    r"""Prepares a method that learns from data and is not prepared for
    ``layer`` yet (an unfitted DiffMask, a bottleneck without statistics); what
    the preparation reports."""
    if not method_trait(explainer, "needs_data") or explainer.is_prepared(layer):
        return {}
    if train_data is None:
        name = type(explainer).__name__
        raise ValueError(f"train_data is needed to prepare {name} ({name}.{explainer.data_step} learns from data), "
                         f"or pass it prepared")
    return explainer.prepare_on_data(train_data, layer, routed["data"], seed=seed, verbose=verbose,
                                     max_steps=fit_steps)


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
                    :class:`DiffMask`), a name of :data:`METHODS`, or
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
    name = method[0] if isinstance(method, tuple) else method if isinstance(method, str) else type(method).__name__
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
                        bool(method_trait(explainer, "scores_are_probabilities")), scored)


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
