"""Studies beside the suites: one question each, run by the harness
(``python -m benchmarks study NAME [ARGS]``, listed by ``python -m benchmarks
list``) and, where it has one, with a committed report under ``docs/results/``.

A study is a module of this package with a one-line ``QUESTION`` and a
``main(argv)`` that takes its command line; nothing else lists it. Its name is
the module's, with dashes (``sst-sweep`` for :mod:`.sst_sweep`). A study imports
the harness's modules, :mod:`benchmarks.common` and the suites' public names
(their packages' ``__all__``), never a suite's own modules. ``peer_ferret`` and
``peer_inseq`` are not studies but the peers' sides of ``peer-agreement``, run in
their own environment.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Dict


def registered_studies() -> Dict[str, str]:
    r"""Every study: name (dashes) -> its ``QUESTION``, by name."""
    found = {}
    for module in pkgutil.iter_modules(__path__, __name__ + "."):
        study = importlib.import_module(module.name)
        question = getattr(study, "QUESTION", None)
        if question and callable(getattr(study, "main", None)):
            found[module.name.rpartition(".")[2].replace("_", "-")] = question
    return dict(sorted(found.items()))


def load_study(name: str) -> ModuleType:
    r"""The study ``name`` (dashes or underscores); ValueError naming the
    studies for another name."""
    studies = registered_studies()
    key = name.replace("_", "-")
    if key not in studies:
        raise ValueError(f"study must be one of {', '.join(studies)}, got {name!r}")
    return importlib.import_module(f"{__name__}.{key.replace('-', '_')}")
