"""The code on the user pages runs."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = [
    "guide/getting-started.md", "guide/diffmask.md", "guide/methods.md", "guide/comparing.md",
    "guide/evaluating.md", "guide/your-model.md", "guide/transformers.md", "guide/language-models.md",
]


def _python_blocks(page: pathlib.Path):
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.parametrize("name", PAGES)
def test_page_code_runs(name):
    page = DOCS / name
    if not page.exists():
        pytest.fail(f"docs/{name} is missing")
    blocks = _python_blocks(page)
    assert blocks, f"docs/{name} has no python code"
    namespace: dict = {}
    for block in blocks:  # blocks of one page share a namespace, as in a session
        exec(compile(block, str(page), "exec"), namespace)


def test_the_api_table_is_generated_from_all_and_current():
    import subprocess
    import sys

    script = DOCS / "api_table.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True,
                          cwd=DOCS.parent)
    assert done.returncode == 0, done.stderr
    table = (DOCS / "api.md").read_text()
    import captum_diffmask

    for name in captum_diffmask.__all__:
        if not name.startswith("__"):
            assert f"| `{name}` |" in table, name


def test_the_results_index_is_generated_from_the_reports_and_current():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(DOCS / "results_index.py"), "--check"], capture_output=True, text=True,
                          cwd=DOCS.parent)
    assert done.returncode == 0, done.stderr
    index = (DOCS / "results" / "README.md").read_text()
    for page in (DOCS / "results").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, page.name
