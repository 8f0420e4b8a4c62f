"""What the suites show while they run (benchmarks/progress.py)."""

from benchmarks.progress import bar


def test_a_named_loop_in_a_log_says_when_it_ends_and_how_many_it_did(capsys):
    # pytest's captured stderr is not a terminal: a log, as in a nohup'ed run
    assert list(bar(range(3), True, desc="attribute DiffMask")) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("  attribute DiffMask: 3 done in ") and lines[0].endswith(" s")


def test_a_quiet_loop_or_an_unnamed_one_writes_nothing(capsys):
    assert list(bar(range(3), False, desc="methods")) == [0, 1, 2]
    assert list(bar(range(2), True)) == [0, 1]
    assert capsys.readouterr().err == ""
