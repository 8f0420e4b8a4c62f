"""What the suites show while they run: a line per step, progress bars, and a
failing method's error in one line."""

from __future__ import annotations

import logging
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


def show_library_progress(verbose: bool) -> None:
    r"""When ``verbose``, the library's own progress lines go to stderr: a fit's
    line per layer and epoch, which it writes at INFO on the ``captum_diffmask``
    logger (and its progress bar shows only on a terminal), so a long fit's log
    says where it is. Once per process; a handler the caller attached is kept."""
    logger = logging.getLogger("captum_diffmask")
    if verbose and not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("  %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class _StderrHandler(logging.StreamHandler):
    r"""Writes to ``sys.stderr`` as it is when a line is written, not as it was
    when the handler was made (a caller or a test may replace it in between)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


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
