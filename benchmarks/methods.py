"""The methods the suites compare, set up through the library's own
:func:`captum_diffmask.methods.prepare_method` (the API behind
:func:`captum_diffmask.compare`) by the names of the library's registry
(:func:`captum_diffmask.methods.registered_methods`): the harness adds no method
code, and a method registered anywhere is one a suite can run.

A suite gives its model, sites and training data as a :class:`MethodContext`;
:func:`prepare` turns a method's flat options (each routed to the constructor,
``fit`` / ``fit_statistics`` or ``attribute``, whichever names it) into a
:class:`~captum_diffmask.methods.PreparedMethod`. ``batch_size`` is the
harness's own option: the training batch size of a fit or of the statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

import torch
from torch import nn

from captum_diffmask.methods import method_class, prepare_method, PreparedMethod, registered_methods, route_options
from captum_diffmask.model.attribution import method_trait

__all__ = ["AUTHORS_OPTIONS", "MethodContext", "PreparedMethod", "methods_listed", "prepare", "route_options"]

#: The options of the authors' code where the library's defaults differ, which
#: every suite and study runs so that its reports stay the paper's settings:
#: Integrated Gradients with the trapezoid rule and a zero baseline (the
#: library's defaults are Gauss-Legendre and the mean state, under which the
#: completeness gap is small; see :class:`~captum_diffmask.methods.IntegratedGradients`).
AUTHORS_OPTIONS: Dict[str, Dict[str, Any]] = {
    "IntegratedGradients": {"method": "riemann_trapezoid", "baselines": 0.0},
}


def methods_listed() -> Dict[str, str]:
    r"""One line per registered method, for ``python -m benchmarks list`` and
    the reports: each method's own name and ``summary``."""
    return {name: method_trait(cls, "summary") for name, cls in registered_methods().items()}


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


def prepare(name: str, ctx: MethodContext, options: Mapping[str, Any]) -> PreparedMethod:
    r"""Sets one method up; errors propagate (the suite records them)."""
    cls = method_class(name)
    options = {**AUTHORS_OPTIONS.get(name, {}), **options}
    batch_size = int(options.pop("batch_size", 128))
    if name == "Random":
        options.setdefault("seed", ctx.seed + 7919)  # its own stream, apart from the other methods'
    train = ctx.train_loader(batch_size, ctx.seed) if method_trait(cls, "needs_data") else None
    torch.manual_seed(ctx.seed)
    prepared = prepare_method(
        (name, options), ctx.model, train_data=train, layer=ctx.layer, sites=ctx.sites(),
        padding_mask_arg=ctx.padding_mask_arg, fit_steps=None, seed=ctx.seed, verbose=ctx.verbose,
    )
    prepared.name = name
    return prepared
