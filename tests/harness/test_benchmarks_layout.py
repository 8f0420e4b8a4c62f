"""The harness a researcher extends: every study registered with the runner, and
suites and studies that import other suites only through their public names."""

import ast
import importlib
import pathlib

import pytest

from benchmarks.__main__ import main
from benchmarks.runner import SUITES
from benchmarks.studies import registered_studies

ROOT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
#: The peers' sides of peer-agreement: run in the peers' own environment, not studies.
NOT_STUDIES = {"__init__", "peer_ferret", "peer_inseq"}


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _suite_imports(path: pathlib.Path):
    r"""(suite, submodule or None, names) of every import of a suite, anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks.suites"):
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
            if len(parts) == 2:  # from benchmarks.suites import sst
                yield from ((name, None, []) for name in names)
            else:
                yield parts[2], ".".join(parts[3:]) or None, names
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if alias.name.startswith("benchmarks.suites.") and len(parts) > 2:
                    yield parts[2], ".".join(parts[3:]) or None, []


def _offenders():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module(path)
        own = module.split(".")[2] if module.startswith("benchmarks.suites.") else None
        for suite, submodule, names in _suite_imports(path):
            if suite == own:
                continue
            if submodule is not None:
                found.append(f"{module} imports benchmarks.suites.{suite}.{submodule}")
                continue
            public = set(getattr(importlib.import_module(f"benchmarks.suites.{suite}"), "__all__", ()))
            found += [f"{module} imports {suite}.{name}, not in its __all__" for name in names if name not in public]
    return found


def test_suites_and_studies_import_other_suites_only_by_their_public_names():
    assert _offenders() == []


def test_every_study_is_registered_and_listed():
    studies = {p.stem for p in (ROOT / "studies").glob("*.py")} - NOT_STUDIES
    assert set(registered_studies()) == {name.replace("_", "-") for name in studies}


def test_the_runner_lists_and_runs_a_study(capsys):
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for name, question in registered_studies().items():
        assert f"  {name:<24} {question}" in listed
    with pytest.raises(SystemExit) as raised:
        main(["study", "sst-sweep", "--help"])
    assert raised.value.code == 0 and "usage: python -m benchmarks study sst-sweep" in capsys.readouterr().out
    assert main(["study", "no-such-study"]) == 2
    assert "study must be one of attribution-speed" in capsys.readouterr().err


def test_every_suite_is_a_package():
    for name, module in SUITES.items():
        assert (ROOT.parent / module.replace(".", "/") / "__init__.py").exists(), name
