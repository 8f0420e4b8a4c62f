"""Jobs in worker processes: results in the jobs' order, the argument checked,
and no worker left running when its run is killed."""

import logging
import operator
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.workers import check_workers, Job, run_jobs


def test_the_results_come_in_the_jobs_order_with_one_worker_or_two():
    jobs = [Job(f"add {i}", operator.add, (i, 10)) for i in range(5)] + [Job("sleep", time.sleep, (0.5,))]
    assert run_jobs(jobs, 2, verbose=False) == [10, 11, 12, 13, 14, None]
    assert run_jobs(jobs, 1, verbose=False) == [10, 11, 12, 13, 14, None]


def test_a_job_that_raises_raises_in_the_run():
    with pytest.raises(TypeError):
        run_jobs([Job("bad", operator.add, (1, "a")), Job("good", operator.add, (1, 2))], 2, verbose=False)


@pytest.mark.parametrize("verbose", [True, False])
def test_off_a_terminal_a_workers_library_lines_reach_the_runs_stderr_unless_quiet(capfd, verbose):
    say = logging.getLogger("captum_diffmask").info  # a job that logs as a verbose fit does
    jobs = [Job(f"say {i}", say, (f"a line from job {i}",)) for i in range(2)]
    assert run_jobs(jobs, 2, verbose=verbose) == [None, None]
    err = capfd.readouterr().err
    assert all(("a line from job %d" % i in err) is verbose for i in range(2))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_workers_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        check_workers(bad)


JOB_MODULE = """
import os, time

def mark_then_sleep(folder, seconds):
    # a worker runs its job only after its initializer: the mark says it is armed
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(seconds)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_run_leaves_no_worker_running(tmp_path):
    (tmp_path / "sleepy_jobs.py").write_text(JOB_MODULE)
    marks = tmp_path / "marks"
    marks.mkdir()
    code = ("from benchmarks.workers import Job, run_jobs; from sleepy_jobs import mark_then_sleep; "
            f"run_jobs([Job('a', mark_then_sleep, ({str(marks)!r}, 120)), "
            f"Job('b', mark_then_sleep, ({str(marks)!r}, 120))], 2, verbose=False)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.time() + 120  # the workers start in their own time on a loaded machine
        while time.time() < deadline and len(list(marks.iterdir())) < 2 and parent.poll() is None:
            time.sleep(0.5)
        workers = [int(mark.name) for mark in marks.iterdir()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers):
            time.sleep(0.5)
        assert not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers)
    finally:
        if parent.poll() is None:
            parent.kill()
        for mark in marks.iterdir():
            if _alive(int(mark.name)):
                os.kill(int(mark.name), signal.SIGKILL)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
