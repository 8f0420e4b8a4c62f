"""Every method of the library by name: the one list that ``compare``, the
command line and the benchmark harness read.

A method declares itself once, in its own module: it subclasses
:class:`~captum_diffmask.model.attribution.SiteAttribution`, says what it is in
class attributes (``label``, the name when it is not the class name;
``summary``; ``needs_data`` and ``data_step``; ``uses_target``) and is
decorated with :func:`register_method`::

    @register_method
    class MyMethod(SiteAttribution):
        summary = "what it does, in one line"

        @attribution_call
        def attribute(self, inputs, target=None, additional_forward_args=None, layer=0): ...

A module added to :mod:`captum_diffmask.methods` is found without being listed
anywhere; a method defined elsewhere (a user's own) is registered when its
module is imported. DiffMask itself lives in the DiffMask layer below and is
registered here, first.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, Type

from captum_diffmask.diffmask.explainer import DiffMask

#: name -> class, in the order tables list them (a module-private store: read it
#: through :func:`registered_methods`, which imports the library's methods first).
_REGISTERED: Dict[str, type] = {}


def register_method(cls: Type) -> Type:
    r"""
    Registers ``cls`` under its name (``cls.name()``: its ``label``, else the
    class name); a class decorator.

    Args:

        cls (type): a method: a class with ``attribute`` (usually a
                    :class:`~captum_diffmask.model.attribution.SiteAttribution`).

    Returns:
        *type*: ``cls`` itself.

    Raises:
        ValueError: another class is registered under that name already.
    """
    if not callable(getattr(cls, "attribute", None)):
        raise TypeError(f"register_method: {cls!r} has no attribute() to register")
    name = cls.name() if hasattr(cls, "name") else cls.__name__
    held = _REGISTERED.get(name)
    if held is not None and (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"register_method: the name {name!r} is {held.__module__}.{held.__qualname__}'s already")
    _REGISTERED[name] = cls
    return cls


def unregister_method(name: str) -> None:
    r"""Removes the method registered as ``name`` (tests, interactive sessions);
    KeyError naming it when there is none."""
    if name not in _REGISTERED:
        raise KeyError(f"unregister_method: no method is registered as {name!r}")
    del _REGISTERED[name]


def registered_methods() -> Dict[str, type]:
    r"""
    Every registered method: the library's (each module of
    :mod:`captum_diffmask.methods` imported first) and any registered since.

    Returns:
        *dict* name -> class, DiffMask first, then in the order they registered.
    """
    package = importlib.import_module("captum_diffmask.methods")
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
    return dict(_REGISTERED)


def method_class(name: str) -> type:
    r"""
    The method registered as ``name``, or whose class is named so (release
    0.1's names: ``"RandomAttribution"`` for ``"Random"``).

    Raises:
        ValueError naming ``name`` and every registered name.
    """
    methods = registered_methods()
    if name in methods:
        return methods[name]
    by_class = {cls.__name__: cls for cls in methods.values()}
    if name in by_class:
        return by_class[name]
    raise ValueError(f"methods: unknown method {name!r}; the registered ones are {sorted(methods)}")


register_method(DiffMask)
