"""The runner: picks a suite, builds its configuration, runs it, and writes
``results.json`` and ``report.md``. Also what every suite shares: the cache of
trained models, timing, the environment record and JSON conventions.

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
  accepts beside :data:`benchmarks.methods.REGISTRY`.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

#: name -> module of every suite.
SUITES: Dict[str, str] = {
    "toy": "benchmarks.suites.toy",
    "toy-robustness": "benchmarks.suites.toy_robustness",
    "toy-lm": "benchmarks.suites.toy_lm",
    "sst-erasure": "benchmarks.suites.sst_erasure",
    "sst": "benchmarks.suites.sst",
    "faithfulness": "benchmarks.suites.faithfulness",
    "squad": "benchmarks.suites.squad",
}

#: How JSON writes what it cannot hold: ``inf`` as the string ``"inf"``, NaN as null.
JSON_CONVENTIONS = 'floats that are infinite are written as the string "inf" (or "-inf"); NaN (not measured) as null'


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
                    :data:`benchmarks.methods.REGISTRY` or the suite's own rows
                    (its ``EXTRA_METHODS``). Default: None (the suite's)
        overrides (Mapping, optional): merged last, e.g. ``{"data":
                    {"num_examples": 2000}}``. Default: None

    Returns:
        *dict*, with ``"quick"`` set.
    """
    from .methods import REGISTRY

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
        known = list(REGISTRY) + [m for m in getattr(suite, "EXTRA_METHODS", ()) if m not in REGISTRY]
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
    from .report import write_report

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
        env = environment()
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
    from .report import write_report

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


# -------------------------------------------------------------- environment
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> Optional[str]:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def environment() -> Dict[str, Any]:
    r"""Versions, threads and CPU of this run."""
    import captum

    import captum_diffmask

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "captum": getattr(captum, "__version__", "?"),
        "captum_diffmask": captum_diffmask.__version__,
        "git_commit": _git_commit(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_name(),
        "platform": platform.platform(),
        "device": "cpu",
    }


# -------------------------------------------------------------------- cache
def cache_dir() -> Path:
    r"""Where trained models are kept: ``$CAPTUM_DIFFMASK_CACHE``, else
    ``~/.cache/captum_diffmask`` (outside the repository)."""
    env = os.environ.get("CAPTUM_DIFFMASK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "captum_diffmask"


def config_hash(obj: Any) -> str:
    r"""A short stable hash of a JSON-able configuration."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def cached(
    kind: str, key: Any, build: Callable[[], Dict[str, Any]], use_cache: bool = True
) -> Tuple[Dict[str, Any], bool]:
    r"""
    Loads ``cache_dir()/KIND-HASH.pt`` when it exists, else builds and stores it.

    Args:

        kind (str): a file-name prefix, e.g. ``"toy-model"``.
        key (Any): the JSON-able configuration that determines the result.
        build (Callable): ``build() -> dict`` of tensors and plain values
                    (``torch.save``-able with ``weights_only`` loading).
        use_cache (bool, optional): False always builds and does not store.
                    Default: True

    Returns:
        *tuple* ``(payload, hit)``.
    """
    if not use_cache:
        return build(), False
    path = cache_dir() / f"{kind}-{config_hash(key)}.pt"
    if path.exists():
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(payload, dict) and payload.get("key") == json.loads(json.dumps(key, default=str)):
                return payload, True
        except Exception:  # noqa: BLE001 - a corrupt or foreign file is rebuilt
            pass
    payload = build()
    payload["key"] = json.loads(json.dumps(key, default=str))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    return payload, False


# ------------------------------------------------------------------- timing
def median_seconds(
    fn: Callable[[], Any], repeats: int = 5, budget_seconds: float = 5.0, warmup: bool = True
) -> Tuple[float, int]:
    r"""
    The median wall time of ``fn()`` over up to ``repeats`` calls.

    Args:

        fn (Callable): the call to time.
        repeats (int, optional): at most this many timed calls. Default: 5
        budget_seconds (float, optional): stop repeating once the timed calls took
                    this long (at least one timed call is always made).
                    Default: 5.0
        warmup (bool, optional): one untimed call first (lazy initialisation,
                    allocator warm-up). Default: True

    Returns:
        *tuple* ``(median seconds, number of timed calls)``.
    """
    if warmup:
        fn()
    times: List[float] = []
    spent = 0.0
    while len(times) < max(1, repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent += times[-1]
        if spent >= budget_seconds:
            break
    return statistics.median(times), len(times)


# --------------------------------------------------------------------- JSON
def to_jsonable(obj: Any) -> Any:
    r"""``obj`` with tensors as lists, tuples as lists, ``inf`` as ``"inf"`` and
    NaN as None (see :data:`JSON_CONVENTIONS`)."""
    if isinstance(obj, torch.Tensor):
        return to_jsonable(obj.tolist())
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def from_json_number(value: Any) -> float:
    r"""The float a JSON value stands for: ``"inf"`` -> inf, None -> NaN."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return float(value)
    return float(value)


def write_json(results: Mapping[str, Any], path: Union[str, os.PathLike]) -> None:
    r"""Writes ``results`` as strict JSON (no bare ``Infinity``/``NaN``)."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(to_jsonable(results), handle, indent=2, allow_nan=False)
        handle.write("\n")
