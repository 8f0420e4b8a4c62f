"""What the suites show while they run (benchmarks/progress.py)."""

import io
import logging
import sys

import pytest

from benchmarks.progress import bar, show_library_progress
from captum_diffmask.diffmask.fit.history import log_epoch

ROW = {"layer": 2, "kl": 0.0123, "l0": 0.75, "lambda": 3.5, "agreement": 0.9, "steps": 100, "status": "unsettled"}


@pytest.fixture
def library_logger():
    logger = logging.getLogger("captum_diffmask")
    handlers, level = list(logger.handlers), logger.level
    logger.handlers.clear()
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_a_named_loop_in_a_log_says_when_it_ends_and_how_many_it_did(capsys):
    # pytest's captured stderr is not a terminal: a log, as in a nohup'ed run
    assert list(bar(range(3), True, desc="attribute DiffMask")) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("  attribute DiffMask: 3 done in ") and lines[0].endswith(" s")


def test_a_quiet_loop_or_an_unnamed_one_writes_nothing(capsys):
    assert list(bar(range(3), False, desc="methods")) == [0, 1, 2]
    assert list(bar(range(2), True)) == [0, 1]
    assert capsys.readouterr().err == ""


def test_a_verbose_run_shows_the_fits_line_per_layer_and_epoch(capsys, library_logger):
    show_library_progress(True)
    show_library_progress(True)  # once per process: a second call adds no second handler
    log_epoch(3, None, [ROW])
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["  DiffMask fit epoch 3/-, layer 2: KL 0.0123, kept share 0.750, lambda 3.5, agreement 0.900, "
                     "100 steps, unsettled"]


def test_a_quiet_run_leaves_the_library_logger_alone(capsys, library_logger):
    show_library_progress(False)
    log_epoch(3, None, [ROW])
    assert library_logger.handlers == [] and capsys.readouterr().err == ""


def test_the_lines_follow_stderr_when_it_is_replaced_later(monkeypatch, library_logger):
    show_library_progress(True)
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    log_epoch(1, 5, [ROW])
    assert later.getvalue().startswith("  DiffMask fit epoch 1/5, layer 2: KL 0.0123")
