"""The library's layers, measured in its imports (``docs/architecture.md``, "The
layers"): each layer imports only the layers below it, no import circle, no
private name imported from another module, and no module over 500 lines."""

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "captum_diffmask"

#: Each layer and the layers it may import (itself included). The package's
#: ``__init__`` (the public API) and ``old_paths`` (release 0.1's import paths)
#: stand above every layer.
MAY_IMPORT: Dict[str, Set[str]] = {
    "model": {"model"},
    "diffmask": {"model", "diffmask"},
    "methods": {"model", "diffmask", "methods"},
    "evaluation": {"model", "diffmask", "methods", "evaluation"},
    "interface": {"model", "diffmask", "methods", "evaluation", "interface"},
}
#: Inside the DiffMask layer: the constrained optimisation knows nothing of the
#: fit or the explainer, and the fit nothing of the explainer (it trains a
#: ``Fittable``).
INSIDE_DIFFMASK: Dict[str, Set[str]] = {
    "constrained": {"constrained"},
    "fit": {"constrained", "fit", "probes", "gates", "stacking", "hard_concrete", "sparsity", "component_probe"},
}
#: What any module may import: release 0.1's import paths (it imports nothing
#: of the library by name; a package's ``__getattr__`` hands old names to it).
ANYWHERE = {"old_paths"}
MOST_LINES = 500


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Dict[str, pathlib.Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: pathlib.Path) -> Iterator[Tuple[str, List[str]]]:
    r"""(module, names) of every import of the library's modules, at any depth of
    the file (an import inside a function counts); relative ones resolved."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            yield module, [alias.name for alias in node.names]


def _library_edges() -> Dict[str, Set[str]]:
    r"""module -> the library's modules it imports (a name that is a submodule
    counts as that module)."""
    modules = _modules()
    edges: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _imports(path):
            if module.split(".")[0] != "captum_diffmask":
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            targets |= set(subs) or {module}
        edges[name] = targets - {name}
    return edges


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(edges: Dict[str, Set[str]]) -> List[str]:
    found = []
    for module, targets in edges.items():
        layer = _layer(module)
        if layer not in MAY_IMPORT:
            continue  # the public API and the old paths
        for target in targets:
            if _layer(target) not in MAY_IMPORT[layer] | ANYWHERE:
                found.append(f"{module} imports {target}")
            inner, wanted = module.split(".")[2:3], target.split(".")[2:3]
            if layer == "diffmask" == _layer(target) and inner and inner[0] in INSIDE_DIFFMASK:
                if wanted and wanted[0] not in INSIDE_DIFFMASK[inner[0]]:
                    found.append(f"{module} imports {target}")
    return sorted(found)


def _circles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    r"""The import circles among the library's modules (one path per circle found)."""
    circles, state = [], {}

    def visit(node: str, path: List[str]) -> None:
        state[node] = "open"
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return circles


def test_each_layer_imports_only_the_layers_below_it():
    assert _violations(_library_edges()) == []


def test_no_import_circle():
    assert _circles(_library_edges()) == []


def test_no_private_name_is_imported_from_another_module():
    offenders = []
    for name, path in _modules().items():
        for module, names in _imports(path):
            if module.split(".")[0] == "captum_diffmask" and module != name:
                offenders += [f"{name}: {module}.{n}" for n in names if n.startswith("_") and n != "__version__"]
    assert offenders == []


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MOST_LINES}
    assert long == {}


def test_the_checks_catch_an_offender():
    # a model-layer module importing the explainer, a circle, and a layer rule inside diffmask
    edges = {
        "captum_diffmask.model.sites": {"captum_diffmask.diffmask.explainer"},
        "captum_diffmask.diffmask.explainer": {"captum_diffmask.model.sites"},
        "captum_diffmask.diffmask.constrained.multipliers": {"captum_diffmask.diffmask.fit.loop"},
    }
    assert _violations(edges) == [
        "captum_diffmask.diffmask.constrained.multipliers imports captum_diffmask.diffmask.fit.loop",
        "captum_diffmask.model.sites imports captum_diffmask.diffmask.explainer",
    ]
    assert _circles(edges) == [["captum_diffmask.diffmask.explainer", "captum_diffmask.model.sites",
                                "captum_diffmask.diffmask.explainer"]]


@pytest.mark.parametrize("old, new", [
    ("captum_diffmask.sites", "captum_diffmask.model.sites"),
    ("captum_diffmask.fitting", "captum_diffmask.diffmask.fit"),
])
def test_an_old_import_path_still_imports_with_a_warning_naming_the_new_one(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        importlib.import_module(old)
