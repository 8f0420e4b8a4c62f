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
