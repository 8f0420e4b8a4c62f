"""Bookkeeping that every suite shares: the cache of trained models, timing,
the record of the environment a run had, and the JSON conventions of the
results files."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

#: How JSON writes what it cannot hold: ``inf`` as the string ``"inf"``, NaN as null.
JSON_CONVENTIONS = 'floats that are infinite are written as the string "inf" (or "-inf"); NaN (not measured) as null'


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


def git_commit() -> Optional[str]:
    r"""The short hash of the repository's HEAD (``$CAPTUM_DIFFMASK_COMMIT`` when
    set, for a copy of the tree without its history), or None outside a git checkout."""
    if os.environ.get("CAPTUM_DIFFMASK_COMMIT"):  # a copy of the tree without .git (a remote machine)
        return os.environ["CAPTUM_DIFFMASK_COMMIT"]
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


def environment(device: Optional[str] = None) -> Dict[str, Any]:
    r"""Versions, threads, CPU and device of this run (``device``: where the
    suite's model ran, the CPU when None; a GPU is named)."""
    import captum

    import captum_diffmask

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "captum": getattr(captum, "__version__", "?"),
        "captum_diffmask": captum_diffmask.__version__,
        "git_commit": git_commit(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_name(),
        "platform": platform.platform(),
        "device": _device_name(device),
    }


def _device_name(device: Optional[str]) -> str:
    r"""``"cpu"``, or the device and the GPU's name (``"cuda: NVIDIA H200"``)."""
    chosen = torch.device(device or "cpu")
    if chosen.type == "cuda" and torch.cuda.is_available():
        return f"{chosen}: {torch.cuda.get_device_name(chosen)}"
    return str(chosen)


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
def synchronize(device: torch.device) -> None:
    r"""Waits for ``device``'s queued work (a GPU's kernels run asynchronously),
    so that a timer around a call counts all of it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def read_json_lines(path: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    r"""The JSON lines of ``path`` (a study's appended records), none when it
    does not exist; blank lines skipped."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_json(results: Mapping[str, Any], path: Union[str, os.PathLike]) -> None:
    r"""Writes ``results`` as strict JSON (no bare ``Infinity``/``NaN``)."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(to_jsonable(results), handle, indent=2, allow_nan=False)
        handle.write("\n")
