"""The import paths of release 0.1's flat layout, kept working for one release.

The library moved into layers (``docs/architecture.md``): ``captum_diffmask.sites``
is now :mod:`captum_diffmask.model.sites`, ``captum_diffmask.fitting`` lives in
:mod:`captum_diffmask.diffmask.fit`, and so on. An old path still imports, with a
``DeprecationWarning`` that names the new one: a moved module is the new module
itself (the same object, so a patch through either name reaches both); a module
split in parts is a thin module that hands each name to the part that holds it.
Nothing here is imported by the library's own modules; the table is the one
place that knows the old layout, and goes with the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence, Union

#: Old module -> its new module, or, for a module split in parts, name -> new
#: module with ``"*"`` for every name not listed.
MOVED_MODULES: Dict[str, Union[str, Mapping[str, str]]] = {
    "captum_diffmask.checks": "captum_diffmask.model.checks",
    "captum_diffmask.rng": "captum_diffmask.model.rng",
    "captum_diffmask.batches": "captum_diffmask.model.batches",
    "captum_diffmask.outputs": "captum_diffmask.model.outputs",
    "captum_diffmask.site_finding": "captum_diffmask.model.site_finding",
    "captum_diffmask.sites": "captum_diffmask.model.sites",
    "captum_diffmask.components": "captum_diffmask.model.components",
    "captum_diffmask.forward": "captum_diffmask.model.forward",
    "captum_diffmask.attribution": "captum_diffmask.model.attribution",
    "captum_diffmask.objective": {
        "*": "captum_diffmask.model.divergences",
        "L0_KINDS": "captum_diffmask.diffmask.sparsity",
        "l0_penalty": "captum_diffmask.diffmask.sparsity",
        "LagrangeMultipliers": "captum_diffmask.diffmask.constrained.multipliers",
        "MULTIPLIER_RULES": "captum_diffmask.diffmask.constrained.multiplier_rules",
        "multiplier_rates": "captum_diffmask.diffmask.constrained.multipliers",
    },
    "captum_diffmask.text": {
        "*": "captum_diffmask.model.texts",
        "Explanation": "captum_diffmask.interface.explanation",
        "explain": "captum_diffmask.interface.explanation",
    },
    "captum_diffmask.html_view": "captum_diffmask.interface.html",
    "captum_diffmask.visualization": "captum_diffmask.interface.figures",
    "captum_diffmask.generation": "captum_diffmask.interface.generation",
    "captum_diffmask.cli": "captum_diffmask.interface.cli",
    "captum_diffmask.toy": "captum_diffmask.evaluation.toy_task",
    "captum_diffmask.hard_concrete": "captum_diffmask.diffmask.hard_concrete",
    "captum_diffmask.probes": "captum_diffmask.diffmask.probes",
    "captum_diffmask.component_probe": "captum_diffmask.diffmask.component_probe",
    "captum_diffmask.gates": "captum_diffmask.diffmask.gates",
    "captum_diffmask.stacking": "captum_diffmask.diffmask.stacking",
    "captum_diffmask.checkpoint": "captum_diffmask.diffmask.saved_probe",
    "captum_diffmask.controller": "captum_diffmask.diffmask.constrained.pi_control",
    "captum_diffmask.convergence": "captum_diffmask.diffmask.constrained.convergence",
    "captum_diffmask.lookahead": "captum_diffmask.diffmask.constrained.lookahead",
    "captum_diffmask.fitting": "captum_diffmask.diffmask.fit.options",
    "captum_diffmask.resume": "captum_diffmask.diffmask.fit.fit_state",
    "captum_diffmask.distributed": "captum_diffmask.diffmask.fit.distributed",
    "captum_diffmask.evaluation.compare": {
        "*": "captum_diffmask.interface.side_by_side",
        "MethodSpec": "captum_diffmask.methods.preparation",
        "PreparedMethod": "captum_diffmask.methods.preparation",
        "prepare_method": "captum_diffmask.methods.preparation",
        "route_options": "captum_diffmask.methods.preparation",
    },
    "captum_diffmask.evaluation.comparison": "captum_diffmask.interface.comparison",
}

#: Names that left a package that is still there: package -> name -> new module.
MOVED_NAMES: Dict[str, Mapping[str, str]] = {
    "captum_diffmask.evaluation": {
        "compare": "captum_diffmask.interface.side_by_side",
        "Comparison": "captum_diffmask.interface.comparison",
        "MethodResult": "captum_diffmask.interface.comparison",
        "prepare_method": "captum_diffmask.methods.preparation",
        "PreparedMethod": "captum_diffmask.methods.preparation",
        "route_options": "captum_diffmask.methods.preparation",
    },
}


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path goes with the next release", DeprecationWarning, stacklevel=3)


def moved_name(package: str, name: str) -> Any:
    r"""
    ``package.name`` for a name that moved out of ``package`` (a package's
    module-level ``__getattr__`` hands its old names here).

    Raises:
        AttributeError as Python's own when ``name`` did not move.
    """
    new = MOVED_NAMES.get(package, {}).get(name)
    if new is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _deprecated(f"{package}.{name}", f"{new}.{name}")
    return getattr(importlib.import_module(new), name)


class _SplitModule(types.ModuleType):
    r"""An old module split in parts: each name is read from its part."""

    def __init__(self, name: str, parts: Mapping[str, str]) -> None:
        super().__init__(name, f"Moved: the names of {name} now live in {sorted(set(parts.values()))}.")
        self._parts = dict(parts)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        part = self._parts.get(name, self._parts["*"])
        value = getattr(importlib.import_module(part), name)
        return value

    def __dir__(self) -> Sequence[str]:
        names = set()
        for part in set(self._parts.values()):
            names |= {n for n in dir(importlib.import_module(part)) if not n.startswith("_")}
        return sorted(names)


class _OldPathLoader(importlib.abc.Loader):
    def __init__(self, old: str) -> None:
        self.old = old

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED_MODULES[self.old]
        if isinstance(new, str):
            _deprecated(self.old, new)
            return importlib.import_module(new)
        _deprecated(self.old, ", ".join(sorted(set(new.values()))))
        return _SplitModule(self.old, new)

    def exec_module(self, module: types.ModuleType) -> None:
        # the module is the new one, already run (or a thin module that reads
        # from it); importing the old name leaves it as it is
        sys.modules[self.old] = module


class OldPathFinder(importlib.abc.MetaPathFinder):
    r"""Finds the modules of :data:`MOVED_MODULES` under their old names (after
    the regular finders, which know only the new layout)."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _OldPathLoader(fullname))


def install() -> None:
    r"""Lets the old paths import (once per process)."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
