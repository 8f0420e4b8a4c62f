"""Independent jobs of a suite in worker processes side by side.

On a machine of few cores, small models gain little from a second torch thread,
and two fits in two processes of one thread each take about half the time of
one after the other. The jobs must be picklable calls of module-level functions
(the workers are spawned, so nothing of this process's state is inherited);
each seeds its own randomness, so its result does not depend on the process it
ran in (up to the threads' rounding).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import sys
import time
from concurrent.futures import as_completed, ProcessPoolExecutor
from typing import Any, Callable, Dict, List, NamedTuple, Sequence

import torch

from benchmarks.progress import log_to_stderr
from captum_diffmask.diffmask.fit.history import log_lines

#: prctl's option that sends the calling process a signal when its parent ends.
PR_SET_PDEATHSIG = 1


class Job(NamedTuple):
    r"""One call: ``function(*arguments)``, named by ``label`` in the progress lines."""

    label: str
    function: Callable[..., Any]
    arguments: tuple


def check_workers(workers: Any) -> int:
    r"""``workers`` as an int >= 1, or a ValueError that names it."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    return workers


def start_worker() -> None:
    r"""One torch thread; on Linux the worker ends with this process (a run
    stopped by a signal leaves no fit running on without it)."""
    torch.set_num_threads(1)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # another C library: the worker may outlive a killed run
            pass


def _logged(lines: bool, function: Callable[..., Any], *arguments: Any) -> Any:
    r"""``function(*arguments)`` in a worker, with the library's INFO lines (a
    verbose fit's line per layer and epoch) on the worker's stderr when
    ``lines``: a spawned worker has none of the run's logging."""
    with log_lines(lines, timestamps=True):
        return function(*arguments)


def run_jobs(jobs: Sequence[Job], workers: int, verbose: bool = True, prefix: str = "") -> List[Any]:
    r"""
    Every job's result, in the order of ``jobs``.

    Args:

        jobs (sequence of Job): the calls; with several workers they start in
                    this order (put the longest first).
        workers (int): processes side by side, one torch thread each (spawned);
                    1 runs the jobs here, one after the other, on this
                    process's threads.
        verbose (bool, optional): a line as each job ends; off a terminal, the
                    library's INFO lines of the jobs in workers (as
                    ``python -m benchmarks run`` shows them in its own
                    process). Default: True
        prefix (str, optional): the lines' prefix, e.g. ``"[components] "``.

    Returns:
        *list* the results. A job's exception is raised here (the other jobs
        are cancelled or run to their end first).
    """
    workers = check_workers(workers)
    start = time.perf_counter()
    if workers == 1 or len(jobs) <= 1:
        results = []
        for job in jobs:
            results.append(job.function(*job.arguments))
            log_to_stderr(verbose, f"{prefix}{job.label}: done ({time.perf_counter() - start:.0f} s in)")
        return results
    done: Dict[int, Any] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=start_worker) as pool:
        lines = verbose and not sys.stderr.isatty()
        futures = {pool.submit(_logged, lines, job.function, *job.arguments): index for index, job in enumerate(jobs)}
        for future in as_completed(futures):
            index = futures[future]
            done[index] = future.result()
            log_to_stderr(verbose, f"{prefix}{jobs[index].label}: done in a worker "
                                   f"({time.perf_counter() - start:.0f} s in, {len(done)} of {len(jobs)})")
    return [done[index] for index in range(len(jobs))]
