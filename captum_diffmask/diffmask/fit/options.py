"""The options of :meth:`DiffMask.fit <captum_diffmask.diffmask.explainer.DiffMask.fit>`:
twelve a user holds in their head, each documented once in :class:`FitOptions`,
three of them groups of the rest (:class:`~captum_diffmask.diffmask.constrained.convergence.Convergence`,
:class:`~captum_diffmask.diffmask.fit.option_groups.Compute`,
:class:`~captum_diffmask.diffmask.fit.option_groups.Optimization`), all checked
before any forward pass. :func:`fit_options` merges the caller's with the
defaults; :func:`grouped_options` puts release 0.1's flat names
(``precision=...``, ``until_converged=...``) in their groups.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.convergence import Convergence
from captum_diffmask.diffmask.fit.fit_state import PathLike
from captum_diffmask.diffmask.fit.option_groups import (
    check_count, check_not_negative, check_positive, Compute, Optimization, Validation,
)
from captum_diffmask.model.arguments import check_layer
from captum_diffmask.model.forward import Batch

#: The groups and the classes that hold them.
GROUPS = {"convergence": Convergence, "compute": Compute, "optimization": Optimization}
#: Release 0.1's flat names of grouped options: name -> (group, field).
FLAT_NAMES: Dict[str, tuple] = {
    **{f.name: ("compute", f.name) for f in dataclasses.fields(Compute)},
    **{f.name: ("optimization", f.name) for f in dataclasses.fields(Optimization)},
    "until_converged": ("convergence", "until_converged"),
    "freeze_converged": ("convergence", "freeze_converged"),
    "eps_valid": ("validation", "eps"),
    "agreement_valid": ("validation", "agreement"),
}


@dataclass
class FitOptions:
    r"""
    The options of :meth:`DiffMask.fit`, checked before any forward pass.

    Attributes:
        eps (float): the margin on KL(original || masked), nats, on the batch
                    mean: how far the masked model's output may move. Default: 0.1
        layers (sequence of int, optional): the trained layers; all when None.
        max_steps (int, optional): the most steps (optimiser steps, one per
                    batch) in all (a cap). When neither it nor ``epochs`` is
                    given, the convergence criterion's budget:
                    ``convergence.budget`` steps at each layer (4 000 by default;
                    with a cool-down, plus its steps), so that a fit ends in
                    bounded time.
        epochs (int, optional): the most passes over the data loader (a cap);
                    None: as many as the steps need.
        lr (float): learning rate of the gate networks. Default: 3e-3
        seed (int, optional): seeds the probe's initialisation, the gate noise and
                    the layer draw, on a fork of the global RNG (the caller's
                    state is left as found).
        verbose (bool): a progress bar per epoch with the last window's figures,
                    and a log line per layer and epoch. Default: True
        validation (iterable or Validation, optional): held-out batches scored
                    after every epoch with deterministic gates; the probe of the
                    sparsest epoch that keeps KL <= eps at every trained layer is
                    restored at the end (:class:`Validation` sets other bounds).
        checkpoint (str or PathLike, optional): a file the fit's whole state is
                    written to as it goes (``compute.checkpoint_every``) and at
                    its end; a fit given a file that exists resumes from it and
                    ends with the probe of an uninterrupted fit (at the rates
                    the state holds: it warns when this call's ``lr`` or
                    ``lr_baseline`` differ); one that ended
                    at its cap goes on when ``max_steps`` or ``epochs`` is raised
                    (:mod:`captum_diffmask.diffmask.fit.fit_state`).
        convergence (Convergence or dict, optional): the criterion, and whether
                    the fit stops once every layer has its verdict
                    (``until_converged``) and freezes a layer once it has its
                    own (``freeze_converged``). Default: ``Convergence()``
        compute (Compute or dict, optional): how the fit spends compute: the
                    model's precision, the layers per batch, the stacked passes,
                    the kept activations, the state's writes. Default: ``Compute()``
        optimization (Optimization or dict, optional): the recipe: the probe's
                    optimiser, the baselines' rate, the multipliers' rule and
                    ceiling, the constraint's measure, and the research options.
                    Default: ``Optimization()``
    """

    eps: float = 0.1
    layers: Optional[Sequence[int]] = None
    max_steps: Optional[int] = None
    epochs: Optional[int] = None
    lr: float = 3e-3
    seed: Optional[int] = None
    verbose: bool = True
    validation: Union[None, Iterable[Batch], Validation] = None
    checkpoint: Optional[PathLike] = None
    convergence: Convergence = Convergence()
    compute: Compute = Compute()
    optimization: Optimization = Optimization()

    def __post_init__(self) -> None:
        # a group given as a dict of its fields, or None for its defaults
        for name, group in GROUPS.items():
            value = getattr(self, name)
            if value is None:
                setattr(self, name, group())
            elif isinstance(value, Mapping):
                setattr(self, name, _group_from_dict(group, value, name))
            elif not isinstance(value, group):
                raise TypeError(f"{name} must be a {group.__name__} or a dict of its fields, got {type(value).__name__}")
        if isinstance(self.validation, Mapping):
            self.validation = _group_from_dict(Validation, self.validation, "validation")
        elif self.validation is not None and not isinstance(self.validation, Validation):
            self.validation = Validation(self.validation)

    def kl_constraint(self) -> KLConstraint:
        r"""The fit's constraint: ``eps``, and what the multipliers hold
        (``optimization.constraint``)."""
        return KLConstraint(self.eps, self.optimization.constraint)

    def check(self, num_layers: int, gated_layers: Optional[Sequence[int]] = None) -> List[int]:
        r"""Validates every option (errors name it); returns the trained layers
        (``gated_layers``, by default ``0 .. num_layers``, when ``layers`` is None)."""
        if self.epochs is not None:
            check_count(self.epochs, "epochs")
        if self.max_steps is not None:
            check_count(self.max_steps, "max_steps")
        check_positive(self.lr, "lr")
        check_not_negative(self.eps, "eps")
        gated = list(range(num_layers + 1)) if gated_layers is None else list(gated_layers)
        layers = gated if self.layers is None else list(self.layers)
        if not layers:
            raise ValueError("layers must name at least one layer")
        for k in layers:
            check_layer(k, num_layers)
            if k not in gated:
                raise ValueError(f"layers: {k} has no gates here; the layers are {gated}")
        if self.validation is not None:
            self.validation.check()
        self.compute.check()
        self.optimization.check(num_layers)
        return layers


def _group_from_dict(group: type, values: Mapping[str, Any], name: str) -> Any:
    known = [f.name for f in dataclasses.fields(group)]
    unknown = [key for key in values if key not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"{name}: unknown field {unknown[0]!r}{hint} ({group.__name__} has {', '.join(known)})")
    return group(**values)


def grouped_options(flat: Mapping[str, Any]) -> Dict[str, Any]:
    r"""
    Fit options with release 0.1's flat names (``precision="bfloat16"``,
    ``until_converged=False``, ``eps_valid=0.05``) put in their groups
    (``compute``, ``convergence``, ``optimization``, ``validation``), merged
    with a group given beside them; every other name as it is.

    Args:

        flat (Mapping): fit options, flat names and groups mixed.

    Returns:
        *dict* of :class:`FitOptions` fields (and any unknown names, for
        :func:`fit_options` to refuse).
    """
    result = {key: value for key, value in flat.items() if key not in FLAT_NAMES}
    moved: Dict[str, Dict[str, Any]] = {}
    for key, value in flat.items():
        if key in FLAT_NAMES:
            group, field = FLAT_NAMES[key]
            moved.setdefault(group, {})[field] = value
    for group, fields in moved.items():
        given = result.get(group)
        if group == "validation":
            if given is None:
                continue  # bounds without held-out batches select nothing
            if not isinstance(given, (Validation, Mapping)):
                given = Validation(given)
        if given is None:
            result[group] = fields
        elif isinstance(given, Mapping):
            result[group] = {**given, **fields}
        else:
            result[group] = dataclasses.replace(given, **fields)
    return result


def fit_options(options: Union[None, FitOptions, Mapping[str, Any]], overrides: Mapping[str, Any]) -> FitOptions:
    r"""
    The options of a fit: ``options`` (a :class:`FitOptions`, a dict of its
    fields, or None for the defaults) with ``overrides`` set over them. A flat
    name of release 0.1 is put in its group with a ``DeprecationWarning``.

    Raises:
        TypeError naming an unknown option (with the closest known name) or an
        ``options`` of another type.
    """
    if options is None:
        options = FitOptions()
    elif isinstance(options, Mapping):
        overrides, options = {**options, **overrides}, FitOptions()
    elif not isinstance(options, FitOptions):
        raise TypeError(f"options must be a FitOptions, a dict of its fields or None, got {type(options).__name__}")
    flat = [name for name in overrides if name in FLAT_NAMES]
    if flat:
        new = ", ".join(f"{FLAT_NAMES[name][0]}={{{FLAT_NAMES[name][1]!r}: ...}}" for name in flat)
        warnings.warn(f"fit({', '.join(f'{name}=...' for name in flat)}): the option is now in its group, {new}; "
                      "the flat name goes with the next release", DeprecationWarning, stacklevel=3)
        base = {name: getattr(options, name) for name in ("convergence", "compute", "optimization", "validation")}
        overrides = grouped_options({**{k: v for k, v in base.items() if k not in overrides}, **overrides})
    known = [f.name for f in dataclasses.fields(FitOptions)]
    for name in overrides:
        if name not in known:
            close = difflib.get_close_matches(name, known + list(FLAT_NAMES), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise TypeError(f"fit: unknown option {name!r}{hint} The options are FitOptions' fields: {', '.join(known)}")
    return dataclasses.replace(options, **overrides)


def signed_with_options(function: Callable[..., Any]) -> Callable[..., Any]:
    r"""Gives ``function`` (which takes the options as ``**overrides``) a
    signature that lists every :class:`FitOptions` field as a keyword-only
    parameter with its default: ``help()``, editors and the option routing of
    ``compare`` see the options by name, documented once in :class:`FitOptions`."""
    signature = inspect.signature(function)
    kept = [p for p in signature.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in kept}
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(FitOptions) if f.name not in taken]
    function.__signature__ = signature.replace(parameters=kept + options)  # type: ignore[attr-defined]
    # the flat names it still takes, for compare's routing of one flat dict of options
    function.also_accepts = tuple(FLAT_NAMES)  # type: ignore[attr-defined]
    return function
