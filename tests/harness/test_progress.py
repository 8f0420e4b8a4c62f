"""What the suites show while they run (benchmarks/progress.py)."""

import logging

from benchmarks.progress import bar, fit_log


def test_a_named_loop_in_a_log_says_when_it_ends_and_how_many_it_did(capsys):
    # pytest's captured stderr is not a terminal: a log, as in a nohup'ed run
    assert list(bar(range(3), True, desc="attribute DiffMask")) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("  attribute DiffMask: 3 done in ") and lines[0].endswith(" s")


def test_a_quiet_loop_or_an_unnamed_one_writes_nothing(capsys):
    assert list(bar(range(3), False, desc="methods")) == [0, 1, 2]
    assert list(bar(range(2), True)) == [0, 1]
    assert capsys.readouterr().err == ""


def test_a_fits_log_lines_show_inside_the_block_and_the_logger_is_left_as_found(capsys):
    logger = logging.getLogger("captum_diffmask")
    level, handlers = logger.level, list(logger.handlers)
    with fit_log():
        logger.info("DiffMask fit: layer 3 converged")
    with fit_log(False):
        logger.info("not shown")
    logger.info("not shown either")
    assert capsys.readouterr().err.splitlines() == ["DiffMask fit: layer 3 converged"]
    assert (logger.level, logger.handlers) == (level, handlers)
