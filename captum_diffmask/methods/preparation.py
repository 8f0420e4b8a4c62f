"""A method set up by name for a user's model: built with its options (one flat
dict, each routed to the constructor, the step that learns from data, or
``attribute``, whichever names it), prepared on data when it learns from data,
and held with what its setup cost (:class:`PreparedMethod`). ``compare``, the
command line and the benchmark harness set their methods up here, by the names
of the registry (:mod:`~captum_diffmask.methods.registry`)."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from torch import nn, Tensor

from captum_diffmask.methods.registry import method_class
from captum_diffmask.model.attribution import method_name, method_trait
from captum_diffmask.model.forward import Batch

#: A method for :func:`prepare_method`: an object with ``attribute`` (fitted or
#: not), a registered name, or ``(name, options)``.
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
    names |= set(getattr(fn, "also_accepts", ()))  # what it takes beyond its signature (DiffMask.fit's flat names)
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
                    for ``layer`` gets them), a registered name
                    (:func:`~captum_diffmask.methods.registry.registered_methods`), or
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
        method_class(name)  # an unknown name is an error naming the registered ones
        if not isinstance(options, Mapping):
            raise TypeError(f"methods: the options of {name} must be a dict, got {type(options).__name__}")
        return name, None, dict(options)
    if not callable(getattr(method, "attribute", None)):
        raise TypeError(f"methods: expected a name, (name, options) or an object with attribute(), got {method!r}")
    return method_name(method), method, {}


def _construct(
    name: str, model: nn.Module, options: Dict[str, Any], common: Mapping[str, Any], verbose: bool
) -> Tuple[Any, Dict[str, Any], List[str]]:
    r"""Builds the named method; returns it, the options left for fit and
    attribute, and those no signature takes."""
    cls = method_class(name)
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


