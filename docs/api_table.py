"""Writes docs/api.md, the public API table, from the packages' ``__all__``.

Usage (from the repository root)::

    python docs/api_table.py            # rewrites docs/api.md
    python docs/api_table.py --check    # exit 1 when docs/api.md is stale

``tests/library/test_docs.py`` runs the check, so the table follows ``__all__``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any, List, Tuple

#: The packages whose ``__all__`` is the public API, in the table's order.
PACKAGES = ("captum_diffmask", "captum_diffmask.diffmask", "captum_diffmask.methods", "captum_diffmask.evaluation")
TABLE = Path(__file__).resolve().parent / "api.md"


def _kind(value: Any) -> str:
    if inspect.isclass(value):
        return "class"
    if callable(value):
        return "function"
    return "constant"


def _first_sentence(text: str) -> str:
    paragraph = text.strip().split("\n\n")[0].replace("\n", " ")
    # a sentence ends at ". " before a capital, not after "et al" or "e.g"
    sentence = re.split(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z(])", paragraph)[0].rstrip(".")
    return sentence.replace("|", "\\|")


def _constant_comment(name: str) -> Tuple[str, str]:
    r"""The ``#:`` comment above a module-level constant, and its module."""
    pattern = re.compile(rf"((?:^#:.*\n)+)^{re.escape(name)}\s*[:=]", re.MULTILINE)
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("captum_diffmask") or not getattr(module, "__file__", None):
            continue
        match = pattern.search(Path(module.__file__).read_text(encoding="utf-8"))
        if match:
            comment = " ".join(line[2:].strip() for line in match.group(1).splitlines())
            return comment, module_name
    return "", ""


def _describe(value: Any, name: str, package: str) -> Tuple[str, str]:
    r"""The first sentence of what documents ``value`` (its docstring, or the
    ``#:`` comment of a constant), and the module that defines it."""
    if inspect.isclass(value) or callable(value):
        module = getattr(value, "__module__", package)
        return _first_sentence(inspect.getdoc(value) or ""), module
    comment, module = _constant_comment(name)
    return _first_sentence(comment), module or package


def api_table() -> str:
    r"""The markdown of docs/api.md."""
    lines: List[str] = [
        "# Public API",
        "",
        "Generated from the packages' `__all__` by `python docs/api_table.py` (a test keeps it",
        "current): each name, what it is, where it is defined, and the first sentence of its",
        "docstring. The guides show them in use.",
    ]
    for package in PACKAGES:
        module = importlib.import_module(package)
        lines += ["", f"## `{package}`", "", "| name | kind | defined in | what it is |", "|---|---|---|---|"]
        for name in module.__all__:
            if name.startswith("__"):
                continue
            value = getattr(module, name)
            summary, where = _describe(value, name, package)
            lines.append(f"| `{name}` | {_kind(value)} | `{where}` | {summary} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    text = api_table()
    if "--check" in argv:
        current = TABLE.read_text(encoding="utf-8") if TABLE.exists() else ""
        if current != text:
            print(f"{TABLE} is stale: run python docs/api_table.py", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
