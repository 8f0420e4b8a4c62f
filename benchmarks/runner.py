"""The runner: picks a suite, builds its configuration, runs it, and writes
``results.json`` and ``report.md`` (what every suite shares beside, the cache,
timing, the environment record and the JSON conventions, is
:mod:`benchmarks.records`).

A suite is a module (or a package) in ``benchmarks/suites/`` with:

- ``DESCRIPTION`` (str): one line for ``python -m benchmarks list``;
- ``DEFAULTS`` (dict): the full configuration;
- ``QUICK`` (dict): what ``--quick`` overrides (merged into ``DEFAULTS``);
- ``run(config, out_dir, verbose) -> dict``: the results (see
  :mod:`benchmarks.report` for the keys the report reads); figures go to
  ``out_dir / "figures"``;
- optionally ``write_report(results, path, json_name)``, used instead of
  :func:`benchmarks.report.write_report` when a suite's report needs other tables;
- optionally ``EXTRA_METHODS`` (names): rows of its own that ``--methods``
  accepts beside the library's registered methods.
"""

from __future__ import annotations

import copy
import datetime
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch

from benchmarks.records import environment, JSON_CONVENTIONS, write_json

#: name -> module of every suite.
SUITES: Dict[str, str] = {
    "toy": "benchmarks.suites.toy",
    "toy-robustness": "benchmarks.suites.toy_robustness",
    "toy-lm": "benchmarks.suites.toy_lm",
    "sst-erasure": "benchmarks.suites.sst_erasure",
    "sst": "benchmarks.suites.sst",
    "faithfulness": "benchmarks.suites.faithfulness",
    "squad": "benchmarks.suites.squad",
    "components": "benchmarks.suites.components",
}



# ------------------------------------------------------------------- suites
def load_suite(name: str) -> Any:
    r"""The suite module ``name``; ``ValueError`` naming the known suites otherwise."""
    if name not in SUITES:
        raise ValueError(f"suite must be one of {', '.join(sorted(SUITES))}, got {name!r}")
    return importlib.import_module(SUITES[name])


def limit_onednn_cache(capacity: int = 16) -> None:
    r"""Caps oneDNN's cache of compiled kernels (one per tensor shape) unless the
    environment sets it: under bfloat16 autocast on a CPU, batches of every
    length each add kernels, and a DiffMask fit's resident memory grew by ~0.1 GB
    every 10 steps (7.7 GB after 600 steps on SST) with the default capacity of
    1024, and stayed at ~1 GB with 16. Read when oneDNN first builds a kernel, so
    this is called before any model runs."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(int(capacity)))


def merge(base: Mapping[str, Any], override: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    r"""A deep copy of ``base`` with ``override`` merged in (dicts recursively,
    everything else replaced)."""
    result = copy.deepcopy(dict(base))
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def build_config(
    suite: Any,
    quick: bool = False,
    seeds: Union[None, int, Sequence[int]] = None,
    methods: Optional[Sequence[str]] = None,
    overrides: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    r"""
    The configuration a run uses: the suite's ``DEFAULTS``, then ``QUICK`` when
    ``quick``, then ``overrides``, then ``seeds`` and ``methods``.

    Args:

        suite (module): from :func:`load_suite`.
        quick (bool, optional): the quick configuration. Default: False
        seeds (int or sequence of int, optional): N means seeds ``0..N-1``.
                    Default: None (the suite's)
        methods (sequence of str, optional): method names, from
                    the library's registry (:func:`benchmarks.methods.methods_listed`)
                    or the suite's own rows
                    (its ``EXTRA_METHODS``). Default: None (the suite's)
        overrides (Mapping, optional): merged last, e.g. ``{"data":
                    {"num_examples": 2000}}``. Default: None

    Returns:
        *dict*, with ``"quick"`` set.
    """
    from benchmarks.methods import methods_listed

    unknown_keys = sorted(set(overrides or {}) - set(suite.DEFAULTS))
    if unknown_keys:
        raise ValueError(f"overrides: {', '.join(unknown_keys)} is not a setting of this suite; "
                         f"its settings: {', '.join(suite.DEFAULTS)}")
    config = merge(suite.DEFAULTS, suite.QUICK if quick else None)
    config = merge(config, overrides)
    config["quick"] = bool(quick)
    if seeds is not None:
        if isinstance(seeds, bool):
            raise TypeError("seeds must be an int or a sequence of ints")
        if isinstance(seeds, int):
            if seeds < 1:
                raise ValueError(f"seeds must be >= 1, got {seeds}")
            seeds = list(range(seeds))
        config["seeds"] = [int(s) for s in seeds]
    if not config.get("seeds"):
        raise ValueError("seeds: a run needs at least one seed")
    if methods is not None:
        registered = list(methods_listed())
        known = registered + [m for m in getattr(suite, "EXTRA_METHODS", ()) if m not in registered]
        unknown = [m for m in methods if m not in known]
        if unknown:
            raise ValueError(f"methods: unknown {', '.join(unknown)}; known: {', '.join(known)}")
        config["methods"] = list(dict.fromkeys(methods))
    return config


def run_suite(
    name: str,
    out: Union[str, os.PathLike],
    quick: bool = False,
    seeds: Union[None, int, Sequence[int]] = None,
    methods: Optional[Sequence[str]] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    verbose: bool = True,
    stem: Optional[str] = None,
) -> Dict[str, Any]:
    r"""
    Runs a suite and writes its results and report.

    Args:

        name (str): the suite, a key of :data:`SUITES`.
        out (str or PathLike): the output directory (created).
        quick, seeds, methods, overrides: see :func:`build_config`.
        verbose (bool, optional): progress bars and a line per step. Default: True
        stem (str, optional): write ``out/STEM.json`` and ``out/STEM.md`` instead of
                    ``results.json`` and ``report.md`` (for committing several
                    reports in one folder). Default: None

    Returns:
        *dict*: the results, as written to JSON (before the ``inf`` conversion).
    """
    from benchmarks.report import write_report

    suite = load_suite(name)
    config = build_config(suite, quick, seeds, methods, overrides)
    out_dir = Path(out)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    previous_threads = torch.get_num_threads()
    if config.get("threads"):
        # The models here are small: intra-op threads buy little and, on a shared
        # machine, oversubscription makes every step many times slower.
        torch.set_num_threads(int(config["threads"]))
    try:
        start = time.perf_counter()
        results = suite.run(config, out_dir, verbose)
        wall = time.perf_counter() - start
        env = environment(config.get("device"))
    finally:
        torch.set_num_threads(previous_threads)
    command = ["python -m benchmarks run", name, "--out", str(out)]
    if quick:
        command.append("--quick")
    if seeds is not None:
        command += ["--seeds", str(seeds if isinstance(seeds, int) else len(list(seeds)))]
    if methods is not None:
        command += ["--methods", *methods]
    if stem:
        command += ["--stem", stem]
    results = {
        "suite": name,
        "command": " ".join(command) + (f"  # plus config overrides {json.dumps(overrides)}" if overrides else ""),
        "description": suite.DESCRIPTION,
        "mode": "quick" if quick else "full",
        "config": config,
        "environment": env,
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_seconds": wall,
        "json_conventions": JSON_CONVENTIONS,
        **results,
    }
    if getattr(suite, "CHOSEN_ON", None):
        # what every choice of the configuration was made on, as the suite declares it
        results["chosen_on"] = suite.CHOSEN_ON
    json_path = out_dir / f"{stem or 'results'}.json"
    write_json(results, json_path)
    writer = getattr(suite, "write_report", None) or write_report
    writer(results, out_dir / f"{stem or 'report'}.md", json_name=json_path.name)
    if verbose:
        print(f"[{name}] done in {wall:.1f} s: {out_dir / (stem or 'report')}.md", file=sys.stderr)
    return results


def rewrite_report(json_path: Union[str, os.PathLike]) -> Path:
    r"""
    Writes the report of a finished run again from its JSON, with the suite's
    current report writer (the numbers are the run's own; only the text changes).

    Args:

        json_path (str or PathLike): ``DIR/STEM.json`` written by :func:`run_suite`.

    Returns:
        *Path*: the report written beside it (``results.json`` -> ``report.md``,
        ``STEM.json`` -> ``STEM.md``).
    """
    from benchmarks.report import write_report

    json_path = Path(json_path)
    if not json_path.is_file():
        raise ValueError(f"json_path: no such file {str(json_path)!r}")
    results = json.loads(json_path.read_text(encoding="utf-8"))
    if "suite" not in results:
        raise ValueError(f"json_path: {str(json_path)!r} is not the results of a suite run (no 'suite' key)")
    suite = load_suite(results["suite"])
    writer = getattr(suite, "write_report", None) or write_report
    stem = "report" if json_path.stem == "results" else json_path.stem
    path = json_path.with_name(f"{stem}.md")
    writer(results, path, json_name=json_path.name)
    return path
