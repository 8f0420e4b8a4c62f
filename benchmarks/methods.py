"""The registry of attribution methods the suites compare: how to find each class
in the library and how to set it up, with per-suite options.

The harness adds no method code. A registry entry only says where the class lives
(the import is tried at run time, so a method that is not written yet is reported
as unavailable instead of breaking the suite) and what has to happen before
``attribute`` can be called (``DiffMask.fit``, the bottleneck's
``fit_statistics``). Options are given as one flat dict per method; each option
goes to the constructor, to ``fit`` / ``fit_statistics`` or to ``attribute``,
whichever names it, so that the suites do not depend on how a method splits its
arguments. An option that no signature names is recorded as ignored in the
results rather than silently dropped.
"""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn, Tensor

from captum_diffmask.forward import format_additional_args
from captum_diffmask.evaluation.ground_truth import random_attribution

#: Modules searched, in order, for a method class named in the registry.
SEARCH_MODULES = (
    "captum_diffmask",
    "captum_diffmask.methods",
    "captum_diffmask.methods.gradients",
    "captum_diffmask.methods.erasure",
    "captum_diffmask.methods.bottleneck",
    "captum_diffmask.methods.guan",
    "captum_diffmask.methods.per_example",
    "captum_diffmask.methods.reinforce",
)


@dataclass
class MethodContext:
    r"""What a method needs from a suite to be set up.

    Attributes:
        model (nn.Module): the analysed model.
        sites (Callable): ``sites() -> dict`` of explicit sites (a fresh dict per
                    method), or returns None for automatic sites.
        padding_mask_arg (int, str or None): index of the padding mask in
                    ``additional_forward_args``.
        train_loader (Callable): ``train_loader(batch_size, seed) -> iterable`` of
                    shuffled training batches ``(ids, *additional_forward_args)``,
                    for methods that learn from a data set.
        layer (int): the layer ``attribute`` will be called with.
        seed (int): seeds the method's setup.
        verbose (bool): progress bars.
    """

    model: nn.Module
    sites: Callable[[], Optional[Dict[str, Any]]]
    padding_mask_arg: Any
    train_loader: Callable[[int, int], Any]
    layer: int
    seed: int = 0
    verbose: bool = False


@dataclass
class PreparedMethod:
    r"""A method ready to attribute, with what its setup cost.

    Attributes:
        name (str): the registry name.
        explainer (Any): the object whose ``attribute`` is called.
        attribute_kwargs (dict): options routed to ``attribute``.
        setup_seconds (float): construction plus any fitting, in seconds.
        ignored_options (list[str]): options no signature of the method names.
        info (dict): what the setup reports (e.g. the last ``fit`` record).
    """

    name: str
    explainer: Any
    attribute_kwargs: Dict[str, Any] = field(default_factory=dict)
    setup_seconds: float = 0.0
    ignored_options: List[str] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)

    def attribute(self, ids: Tensor, additional_forward_args: Any, layer: int) -> Tensor:
        r"""(B, T) float scores of ``ids`` at ``layer``."""
        result = self.explainer.attribute(
            ids, additional_forward_args=additional_forward_args, layer=layer, **self.attribute_kwargs
        )
        return as_scores(result, ids)


def as_scores(result: Any, ids: Tensor) -> Tensor:
    r"""The (B, T) score tensor inside a method's result (a Tensor or a 1-tuple)."""
    if isinstance(result, (tuple, list)) and len(result) == 1:
        result = result[0]
    if not isinstance(result, Tensor):
        raise TypeError(f"attribute returned {type(result).__name__}, expected a (B, T) Tensor")
    if tuple(result.shape) != tuple(ids.shape):
        raise ValueError(f"attribute returned shape {tuple(result.shape)}, expected {tuple(ids.shape)}")
    return result.detach().float()


# --------------------------------------------------------------------- routing
def _parameters(fn: Optional[Callable[..., Any]]) -> Tuple[set, bool]:
    r"""Named keyword parameters of ``fn`` and whether it takes ``**kwargs``."""
    if fn is None:
        return set(), False
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return set(), False
    names = {
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    var_kw = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
    return names, var_kw


def route_options(
    options: Mapping[str, Any], targets: Sequence[Tuple[str, Optional[Callable[..., Any]]]]
) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    r"""
    Sends each option to the first target whose signature names it (then to the
    first that takes ``**kwargs``).

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


# ------------------------------------------------------------------- builders
def _site_kwargs(ctx: MethodContext) -> Dict[str, Any]:
    sites = ctx.sites()
    kwargs: Dict[str, Any] = {"padding_mask_arg": ctx.padding_mask_arg}
    if sites is not None:
        kwargs["sites"] = sites
    return kwargs


def build_generic(cls: type, ctx: MethodContext, options: Mapping[str, Any]) -> PreparedMethod:
    r"""Constructs ``cls(model, sites=..., padding_mask_arg=..., **init)``, then
    ``fit_statistics(train batches, layer=...)`` when the class has it."""
    options = dict(options)
    batch_size = int(options.pop("batch_size", 128))
    if "verbose" not in options:
        options["verbose"] = ctx.verbose
    fit_statistics = getattr(cls, "fit_statistics", None)
    routed, ignored = route_options(
        options,
        [("init", cls.__init__), ("statistics", fit_statistics), ("attribute", getattr(cls, "attribute", None))],
    )
    ignored = [k for k in ignored if k != "verbose"]  # a courtesy, not a setting
    start = time.perf_counter()
    torch.manual_seed(ctx.seed)
    explainer = cls(ctx.model, **_site_kwargs(ctx), **routed["init"])
    if fit_statistics is not None:
        stats_kwargs = dict(routed["statistics"])
        names, _ = _parameters(fit_statistics)
        if "layer" in names:
            stats_kwargs.setdefault("layer", ctx.layer)
        explainer.fit_statistics(ctx.train_loader(batch_size, ctx.seed), **stats_kwargs)
    seconds = time.perf_counter() - start
    return PreparedMethod(cls.__name__, explainer, routed["attribute"], seconds, ignored)


def build_diffmask(cls: type, ctx: MethodContext, options: Mapping[str, Any]) -> PreparedMethod:
    r"""Constructs :class:`DiffMask` and fits it on the training batches at
    ``layers=[ctx.layer]`` (unless ``layers`` is given), seeded."""
    options = dict(options)
    batch_size = int(options.pop("batch_size", 128))
    options.setdefault("layers", [ctx.layer])
    options.setdefault("seed", ctx.seed)
    options.setdefault("verbose", ctx.verbose)
    routed, ignored = route_options(options, [("init", cls.__init__), ("fit", cls.fit)])
    start = time.perf_counter()
    explainer = cls(ctx.model, **_site_kwargs(ctx), **routed["init"])
    history = explainer.fit(ctx.train_loader(batch_size, ctx.seed), **routed["fit"])
    seconds = time.perf_counter() - start
    info = {"fit_last": history[-1] if history else {}, "fit_steps": int(sum(h.get("steps", 0) for h in history))}
    return PreparedMethod(cls.__name__, explainer, {}, seconds, ignored, info)


class RandomScores:
    r"""The chance reference as an object with ``attribute``: uniform random
    scores at real positions (:func:`captum_diffmask.evaluation.ground_truth.random_attribution`),
    from a private generator, so successive calls differ and a run repeats."""

    def __init__(self, padding_mask_arg: Any = None, seed: int = 0) -> None:
        self.padding_mask_arg = padding_mask_arg
        self.generator = torch.Generator().manual_seed(int(seed))

    def attribute(self, inputs: Tensor, target: Any = None, additional_forward_args: Any = None, layer: int = 0) -> Tensor:
        extra = format_additional_args(additional_forward_args)
        index = self.padding_mask_arg
        if isinstance(index, int) and index < len(extra) and extra[index] is not None:
            mask = extra[index].bool()
        else:
            mask = torch.ones(inputs.shape, dtype=torch.bool)
        return random_attribution(mask, generator=self.generator)


def build_random(cls: Any, ctx: MethodContext, options: Mapping[str, Any]) -> PreparedMethod:
    padding = ctx.padding_mask_arg
    if padding == "auto":
        padding = 0
    ignored = [k for k in options if k not in ("verbose",)]
    return PreparedMethod("Random", RandomScores(padding, seed=ctx.seed + 7919), {}, 0.0, ignored)


@dataclass(frozen=True)
class MethodSpec:
    r"""A registry entry.

    Attributes:
        name (str): the class name, also the method's name in results.
        build (Callable): ``build(cls, ctx, options) -> PreparedMethod``.
        description (str): one line for ``python -m benchmarks list`` and reports.
        builtin (object, optional): the class to use instead of importing ``name``.
    """

    name: str
    build: Callable[[Any, MethodContext, Mapping[str, Any]], PreparedMethod]
    description: str
    builtin: Any = None

    def locate(self) -> Any:
        r"""The method's class, imported now.

        Raises:
            ImportError: no searched module defines it (not written yet, or its
                        module fails to import; the first import error is kept).
        """
        if self.builtin is not None:
            return self.builtin
        errors = []
        for module_name in SEARCH_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                if error.name != module_name:  # the module exists but its imports fail
                    errors.append(f"{module_name}: {type(error).__name__}: {error}")
                continue
            except Exception as error:  # noqa: BLE001 - a broken sibling module
                errors.append(f"{module_name}: {type(error).__name__}: {error}")
                continue
            cls = getattr(module, self.name, None)
            if isinstance(cls, type):
                return cls
        detail = f" ({'; '.join(errors)})" if errors else ""
        raise ImportError(f"{self.name} is not available in captum_diffmask{detail}")

    def available(self) -> Tuple[bool, str]:
        r"""``(True, where)`` or ``(False, why not)``."""
        try:
            cls = self.locate()
        except ImportError as error:
            return False, str(error)
        return True, getattr(cls, "__module__", "?")


REGISTRY: Dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("DiffMask", build_diffmask, "amortised DiffMask: a probe predicts the gates; one pass to attribute"),
        MethodSpec("IntegratedGradients", build_generic, "Integrated Gradients at the site, |sum over H| per token"),
        MethodSpec("Occlusion", build_generic, "leave-one-token-out (Captum's Occlusion, window 1)"),
        MethodSpec("ExactErasure", build_generic, "smallest kept subset that keeps the prediction (exhaustive)"),
        MethodSpec("PerSampleBottleneck", build_generic, "Schulz et al. 2020, per-example Gaussian bottleneck"),
        MethodSpec("Guan", build_generic, "Guan et al. 2019, per-token noise scale with an entropy bonus"),
        MethodSpec("PerExampleDiffMask", build_generic, "DiffMask gates optimised per example (no probe)"),
        MethodSpec("REINFORCE", build_generic, "hard Bernoulli gates, score-function gradient, per example"),
        MethodSpec("Random", build_random, "uniform random scores: the chance reference", builtin=RandomScores),
    ]
}


def available_methods() -> Dict[str, Tuple[bool, str]]:
    r"""``{name: (available, where or why not)}`` for every registry entry."""
    return {name: spec.available() for name, spec in REGISTRY.items()}


def prepare(name: str, ctx: MethodContext, options: Mapping[str, Any]) -> PreparedMethod:
    r"""Locates and sets up one method; errors propagate (the suite records them)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(REGISTRY)}")
    spec = REGISTRY[name]
    cls = spec.locate()
    prepared = spec.build(cls, ctx, options)
    prepared.name = name
    return prepared
