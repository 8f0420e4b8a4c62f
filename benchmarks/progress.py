"""What the suites show while they run: a line per step, progress bars, and a
failing method's error in one line."""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator

from tqdm.auto import tqdm


def log(verbose: bool, message: str) -> None:
    r"""Writes ``message`` (above any progress bar) when ``verbose``."""
    if verbose:
        tqdm.write(message)


def log_to_stderr(verbose: bool, message: str) -> None:
    r"""Prints ``message`` to stderr, flushed, when ``verbose``."""
    if verbose:
        print(message, file=sys.stderr, flush=True)


def bar(iterable: Any, verbose: bool, **kwargs: Any) -> Any:
    r"""``iterable`` with a progress bar when ``verbose`` on a terminal
    (``kwargs`` go to tqdm); when ``verbose`` and stderr is a log, not a
    terminal, a line once a loop named by ``desc`` ends, so a long run's log
    says what it has done."""
    if verbose and kwargs.get("desc") and not sys.stderr.isatty():
        return _logged(iterable, str(kwargs["desc"]))
    return tqdm(iterable, disable=None if verbose else True, leave=False, **kwargs)


def _logged(iterable: Iterable[Any], desc: str) -> Iterator[Any]:
    start, count = time.perf_counter(), 0
    for item in iterable:
        count += 1
        yield item
    log_to_stderr(True, f"  {desc}: {count} done in {time.perf_counter() - start:.0f} s")


def error_text(error: BaseException) -> str:
    r"""``"TypeName: message"``, how a result records a failure."""
    return f"{type(error).__name__}: {error}"
