"""The library stands alone: it never imports the benchmark harness and never reads
the project's data folder, so a user's ``pip install`` gets everything it needs."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "captum_diffmask"
MODULES = sorted(PACKAGE.rglob("*.py"))


def _imported_modules(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_the_package_has_modules():
    assert len(MODULES) > 10


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_the_benchmarks(path):
    imported = [name for name in _imported_modules(path) if name.split(".")[0] == "benchmarks"]
    assert imported == [], f"{path.name} imports {imported}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_names_the_shared_data_folder(path):
    text = path.read_text()
    for needle in ("../shared", '"shared"', "'shared'", "shared/data"):
        assert needle not in text, f"{path.name} names {needle!r}"


def test_the_checks_would_catch_an_offender(tmp_path):
    offender = tmp_path / "bad.py"
    offender.write_text("import benchmarks.runner\nfrom benchmarks import run_suite\nDATA = '../shared/data'\n")
    assert list(_imported_modules(offender)) == ["benchmarks.runner", "benchmarks"]
    assert "../shared" in offender.read_text()


#: The repository's Python packages whose import graph must have no circle.
ROOTS = [PACKAGE, PACKAGE.parent / "benchmarks"]
REPOSITORY_MODULES = sorted(p for root in ROOTS for p in root.rglob("*.py"))


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_imports(path: pathlib.Path):
    r"""``(module, names)`` for each import of a repository module, anywhere in
    the file (function bodies and ``TYPE_CHECKING`` blocks included), relative
    imports resolved to dotted names."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    tops = {root.name for root in ROOTS}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] in tops:
                yield module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in tops:
                    yield alias.name, []


def _import_graph(modules):
    names = {_module_name(p) for p in modules}
    graph = {}
    for path in modules:
        edges = set()
        for module, imported in _package_imports(path):
            targets = [f"{module}.{n}" for n in imported if f"{module}.{n}" in names] or [module]
            edges |= {t for t in targets if t in names}
        # a package's __init__ gathering its own modules is no circle
        graph[_module_name(path)] = {t for t in edges if not t.startswith(_module_name(path) + ".")}
    return graph


def _cycles(graph):
    r"""The import circles of ``graph`` (each a sorted list of modules)."""
    found, done = [], set()

    def visit(node, trail):
        if node in trail:
            found.append(sorted(trail[trail.index(node):]))
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, trail + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_no_import_circle_in_the_repository_not_even_in_function_bodies():
    assert _cycles(_import_graph(REPOSITORY_MODULES)) == []


def test_no_private_name_is_imported_across_modules():
    names = {_module_name(p) for p in REPOSITORY_MODULES}
    private = [(_module_name(path), module, name) for path in REPOSITORY_MODULES
               for module, imported in _package_imports(path)
               for name in imported if name.startswith("_") and not name.startswith("__")
               and f"{module}.{name}" not in names]
    assert private == []


def test_the_circle_check_would_catch_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("path", REPOSITORY_MODULES, ids=lambda p: _module_name(p))
def test_every_module_imports_what_it_names(path):
    # an import of a name the repository no longer has fails only when the module
    # is imported; a missing optional package is not the repository's fault
    import importlib

    try:
        importlib.import_module(_module_name(path))
    except ImportError as error:
        missing = getattr(error, "name", None) or ""
        if missing.split(".")[0] in {root.name for root in ROOTS} or "cannot import name" in str(error):
            raise
        pytest.skip(f"optional package missing: {error}")
