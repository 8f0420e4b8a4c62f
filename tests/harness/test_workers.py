"""Jobs in worker processes: results in the jobs' order, the argument checked,
and no worker left running when its run is killed."""

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


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_workers_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        check_workers(bad)


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_run_leaves_no_worker_running():
    code = ("import time; from benchmarks.workers import Job, run_jobs; "
            "run_jobs([Job('a', time.sleep, (120,)), Job('b', time.sleep, (120,))], 2, verbose=False)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(_children(parent.pid)) < 2:
            time.sleep(0.5)
        time.sleep(3)  # the workers' initializer has run once they take their jobs
        workers = _children(parent.pid)
        assert len(workers) >= 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers):
            time.sleep(0.5)
        assert not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers)
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
