r"""What the timing studies on the sst suite's MiniLM share: the suite's
configuration with a command line's overrides, and a report written with its
JSON beside it."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from benchmarks.records import environment, to_jsonable
from benchmarks.report import study_name
from benchmarks.runner import limit_onednn_cache, merge
from benchmarks.suites.sst import DEFAULTS


def run_study(
    module: str, argv: Optional[List[str]], markdown_path: str, threads: Optional[int], overrides: str,
    measure: Callable[[Mapping[str, Any]], Dict[str, Any]], render: Callable[[Mapping[str, Any], str], str],
) -> int:
    r"""
    Measures on the sst suite's configuration and writes the report.

    Args:

        module (str): the study's module, for the command the report names.
        argv (list of str, optional): the command line's arguments (None: ``sys.argv``).
        markdown_path (str): the report; its JSON is written beside it.
        threads (int, optional): torch CPU threads (None: torch's).
        overrides (str): JSON merged into the suite's :data:`DEFAULTS`.
        measure (callable): configuration -> the result.
        render (callable): (result, command) -> the report's markdown.

    Returns:
        *int* 0, the exit status.
    """
    limit_onednn_cache()
    if threads is not None:
        torch.set_num_threads(threads)
    config = merge(copy.deepcopy(DEFAULTS), json.loads(overrides))
    result = {**measure(config), "environment": environment()}
    command = f"python -m benchmarks study {study_name(module)} " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(markdown_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(result, command), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(to_jsonable(result), indent=1), encoding="utf-8")
    return 0
