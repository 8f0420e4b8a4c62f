"""The code on the reproduction pages runs (they use the benchmark harness, so
they are checked here, beside the harness, and not with the library)."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = ["reproduction/sst-erasure.md"]
#: Pages whose code is not run here, and why.
NOT_RUN = {"reproduction/benchmarks.md": "its example runs a whole suite into out/toy (the runner's tests run it small)"}


@pytest.mark.parametrize("name", PAGES)
def test_reproduction_page_code_runs(name):
    page = DOCS / name
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks, f"docs/{name} has no python code"
    namespace: dict = {}
    for block in blocks:  # blocks of one page share a namespace, as in a session
        exec(compile(block, str(page), "exec"), namespace)


def test_every_reproduction_page_with_python_is_run_here():
    with_code = sorted(str(p.relative_to(DOCS)) for p in (DOCS / "reproduction").glob("*.md")
                       if "```python" in p.read_text())
    assert with_code == sorted(PAGES + list(NOT_RUN))
