"""Writes docs/results/README.md, the index of the committed results, from the
reports themselves.

Usage (from the repository root)::

    python docs/results_index.py            # rewrites docs/results/README.md
    python docs/results_index.py --check    # exit 1 when it is stale

Each report is listed in its group with what its own files say: the command
that made it (the page's ``Command:``), when it ran (the run's start, as its JSON
or its page records it), its headline (the suite's checks met, or the suite's
``headline`` of its JSON, or the page's first sentence) and its data files
(the JSON and JSONL beside it). The groups are the one curated part: a page in
no group, or in two, is an error (``tests/library/test_docs.py`` runs the check).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

RESULTS = Path(__file__).resolve().parent / "results"
INDEX = RESULTS / "README.md"

#: (title, what the group is, its pages' stems) in the order the index shows them.
GROUPS: List[Tuple[str, str, List[str]]] = [
    ("The paper's experiments",
     "each a suite of the harness, `python -m benchmarks run SUITE` (`docs/reproduction/` says how each was run)",
     ["toy", "toy-robustness", "toy-lm", "toy-encoder", "sst-erasure", "sst", "faithfulness", "squad", "components"]),
    ("Cost and reach",
     "what DiffMask costs against one forward pass, how a fit scales, which models it runs on, and our metrics "
     "against the peers'",
     ["attribution-speed", "stacking-speed", "scaling", "user-path", "model-zoo", "peer-agreement"]),
    ("Choices made on train sentences",
     "the settings the reports use, each chosen on data the reports do not score",
     ["eps-calibration-toy", "eps-calibration-sst", "sst-eps-frontier", "sst-eps-layers-input", "sst-eps-layers-hidden", "sst-eps-layers-reseed",
      "sst-readout-tuning", "sst-erasure-readout-tuning", "components-sst-per-task", "components-dev",
      "components-dev-joint", "components-dev-score", "components-dev-baseline"]),
    ("How the fit converges",
     "studies of the fit's recipe on SST and SQuAD, on held-out train sentences",
     ["sst-convergence-input", "sst-convergence-hidden", "sst-per-depth-input", "sst-per-depth-hidden",
      "sst-freeze-hidden", "sst-lr", "sst-input-single-layer", "sst-single-layer-budget", "sst-seed-spread",
      "certificate-noise",
      "squad-fits"]),
    ("Views",
     "pages a reader opens in a browser, drawn from the suites' probes",
     ["sst-depth"]),
    ("The components' ground truth",
     "what a per-input score can reach against tracr's programs",
     ["components-activity"]),
    ("Where the answer is known",
     "fit's defaults on transformers whose answer is known: a toy-task encoder, and a trigger planted in the SST "
     "MiniLM; a second trigger, which no choice saw",
     ["known-answer", "known-answer-tq"]),
]
#: A suite's name as its JSON records it -> the package whose ``headline`` reads it.
SUITE_PACKAGES = {"toy-robustness": "toy_robustness", "sst-erasure": "sst_erasure", "toy-lm": "toy_lm"}


def _title(text: str) -> str:
    match = re.search(r"^# (.+)$", text, re.M)
    return match.group(1).strip() if match else ""


def _command(text: str) -> str:
    r"""The page's first command: a code span with ``python -m benchmarks``."""
    match = re.search(r"`(python -m benchmarks[^`]*)`", text)
    return match.group(1).split("  #")[0].strip() if match else ""


def _first_sentence(text: str) -> str:
    r"""The page's headline: its first sentence with a statement in bold, else
    the first sentence of its prose after its title and command."""
    bold = re.search(r"(?:^|(?<=[.;]\s))([^.;\n|#`]*\*\*[^*\n]+\*\*[^.;\n|]*)", text, re.M)
    if bold:
        return _short(" ".join(bold.group(1).split()), 220)
    for block in re.split(r"\n\s*\n", text):
        block = " ".join(block.strip().split())
        if block.startswith(("Command:", "Commands:")):  # what follows the command's sentence
            block = re.sub(r"^Commands?:(?:[^`.;]|`[^`]*`)*[.;]\s*", "", block)
        if not block or block.startswith(("#", "|", "```", ">", "!", "-", "Command")):
            continue
        sentence = re.split(r"(?<=[.;])\s", block, maxsplit=1)[0]
        return _short(sentence.rstrip(".;"), 220)
    return ""


def _short(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 2].rstrip() + " …"


def _date(text: str, results: Optional[Dict[str, Any]]) -> str:
    r"""When the run started: its JSON's ``started_utc``, else the first date
    the page gives, else the commit its JSON's environment records; "not
    recorded" otherwise."""
    if results and results.get("started_utc"):
        return str(results["started_utc"])[:10]
    match = re.search(r"\b(20\d\d-\d\d-\d\d)\b", text)
    if match:
        return match.group(1)
    commit = ((results or {}).get("environment") or {}).get("git_commit")
    return f"commit `{commit}`" if commit else "not recorded"


def _suite_headline(results: Dict[str, Any]) -> Tuple[str, str]:
    r"""(headline, targets) of a suite's JSON: its checks, or its ``headline``."""
    checks = results.get("checks") or []
    if checks:
        met = sum(bool(check.get("met")) for check in checks)
        first = checks[0]
        return f"{first['target']}: {first.get('value', '')}", f"{met} of {len(checks)} met"
    name = str(results.get("suite", ""))
    package = importlib.import_module(f"benchmarks.suites.{SUITE_PACKAGES.get(name, name)}")
    headline = getattr(package, "headline", None)
    return (headline(results) if callable(headline) else ""), "none stated"


def _data_files() -> Dict[str, List[str]]:
    r"""Each page's data files: the JSON and JSONL whose name starts with its
    stem (the longest such stem)."""
    stems = sorted((page.stem for page in RESULTS.glob("*.md") if page.name != "README.md"), key=len, reverse=True)
    owned: Dict[str, List[str]] = {stem: [] for stem in stems}
    for data in sorted(RESULTS.glob("*.json*")):
        owner = next((stem for stem in stems if data.stem == stem or data.stem.startswith(stem + "-")), None)
        if owner is None:
            raise ValueError(f"{data.name}: no report page owns it (name it after its page)")
        owned[owner].append(data.name)
    return owned


def _row(stem: str, data: List[str]) -> str:
    text = (RESULTS / f"{stem}.md").read_text(encoding="utf-8")
    loaded: Optional[Dict[str, Any]] = None
    if f"{stem}.json" in data:
        content = json.loads((RESULTS / f"{stem}.json").read_text(encoding="utf-8"))
        loaded = content if isinstance(content, dict) else None
    suite = loaded if loaded and "suite" in loaded else None
    headline, targets = _suite_headline(suite) if suite else (_first_sentence(text), "-")
    command = str(suite["command"]).split("  #")[0] if suite else _command(text)
    cells = [f"[{stem}]({stem}.md): {_title(text)}", headline.replace("|", "/"),
             f"`{_short(command, 110)}`" if command else "-", _date(text, loaded), targets,
             ", ".join(f"[{name}]({name})" for name in data) or "-"]
    return "| " + " | ".join(cells) + " |"


def render() -> str:
    r"""The index's text."""
    pages = {page.stem for page in RESULTS.glob("*.md") if page.name != "README.md"}
    grouped = [stem for _, _, stems in GROUPS for stem in stems]
    doubled = sorted({stem for stem in grouped if grouped.count(stem) > 1})
    missing, unknown = sorted(pages - set(grouped)), sorted(set(grouped) - pages)
    if doubled or missing or unknown:
        raise ValueError(f"docs/results_index.py GROUPS: in two groups {doubled}, in none {missing}, "
                         f"no such page {unknown}")
    data = _data_files()
    lines = [
        "# Results", "",
        "Every committed report, by experiment; generated by `python docs/results_index.py` from the reports",
        "themselves (a test keeps it current). *Command* is the page's own, *ran* the run's start as its JSON or",
        "page records it, *headline* the suite's checks (or its headline of the numbers) or the page's first",
        "sentence, *data* the JSON and JSONL the page's numbers come from. Figures are in `figures/`;",
        "superseded runs in [`archive/`](archive/README.md).", "",
    ]
    for title, about, stems in GROUPS:
        lines += [f"## {title}", "", about[0].upper() + about[1:] + ".", "",
                  "| report | headline | command | ran | targets | data |", "|---|---|---|---|---|---|"]
        lines += [_row(stem, data[stem]) for stem in stems]
        lines.append("")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    text = render()
    if "--check" in argv:
        if not INDEX.exists() or INDEX.read_text(encoding="utf-8") != text:
            print(f"{INDEX} is stale: run python docs/results_index.py", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
