"""What the suites show while they run: a line per step, progress bars, and a
failing method's error in one line."""

from __future__ import annotations

import sys
from typing import Any

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
    r"""``iterable`` with a progress bar when ``verbose`` (``kwargs`` go to tqdm)."""
    # disable=None: a bar only on a terminal, so logs and CI stay clean
    return tqdm(iterable, disable=None if verbose else True, leave=False, **kwargs)


def error_text(error: BaseException) -> str:
    r"""``"TypeName: message"``, how a result records a failure."""
    return f"{type(error).__name__}: {error}"
