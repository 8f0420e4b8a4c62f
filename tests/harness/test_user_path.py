"""The user-path study: it times the README's own commands, step by step, and
its report adds the install to each part's time."""

from pathlib import Path

import pytest

from benchmarks.studies.user_path import break_even, readme_commands, report, run_chain, ROOT, total_seconds


def test_the_timed_commands_are_the_readmes_own():
    readme = (ROOT / "README.md").read_text()
    commands = readme_commands(readme)
    assert set(commands) == {"main-job", "tests", "first-explanation"}
    for command in commands.values():
        assert command in readme and command.startswith("python3 -m venv .venv && ")
    assert commands["tests"].endswith("python -m pytest -q")
    assert commands["main-job"].endswith("benchmarks run toy --quick --out out/toy")
    assert commands["first-explanation"].endswith('-e ".[sst]"')
    with pytest.raises(ValueError, match="README.md"):
        readme_commands("# no commands here")


def test_a_chain_is_timed_step_by_step_and_a_failing_step_is_named(tmp_path: Path):
    rows = run_chain("echo one && sleep 0.2 && echo three", tmp_path)
    assert [row[0] for row in rows] == ["echo one", "sleep 0.2", "echo three"]
    assert rows[1][1] >= 0.2 and rows[2][2].strip() == "three"
    with pytest.raises(RuntimeError, match="'exit 3' exited 3"):
        run_chain("true && exit 3 && echo never", tmp_path)


def test_the_report_adds_the_install_to_each_parts_time():
    where = {"cpu": "CPU X", "cores": 2, "load_1min": 0.5, "pip_env": {"PIP_RETRIES": "1"}}
    parts = {
        "main-job": {"command": "a && b", "seconds": 100.0, "started_utc": "2026-11-29T08:47:00+00:00",
                     "machine": where, "steps": [{"step": "python3 -m venv .venv", "seconds": 4.0},
                                                 {"step": ".venv/bin/pip install x", "seconds": 50.0},
                                                 {"step": "run", "seconds": 46.0}]},
        "first-explanation": {"command": "c", "seconds": 30.0, "install_seconds": 70.0, "machine": where,
                              "started_utc": "2026-11-29T08:50:00+00:00",
                              "steps": [{"step": "fit", "seconds": 30.0}]},
    }
    assert total_seconds(parts["main-job"]) == 100.0 and total_seconds(parts["first-explanation"]) == 100.0
    text = report(parts)
    assert "| main-job | 50 | 50 | 100 | 2026-11-29T08:47 | CPU X, 2 cores, load 0.5 at the start |" in text
    assert "| first-explanation | 70 | 30 | 100 |" in text
    assert "| tests | not run |" in text and "`PIP_RETRIES=1`" in text


def test_the_report_holds_each_modes_default_fit_its_verdicts_and_whether_it_was_resumed():
    where = {"cpu": "CPU X", "cores": 2, "load_1min": 0.5, "pip_env": {}}
    fit = {"call": "DiffMask(...).fit(...)", "mode": "input", "sentences": 10, "model": "M", "seconds": 600.0,
           "install_seconds": 0.0, "l0": "mean", "this_run_wall_seconds": 120.0, "epochs": 2, "steps": 40,
           "verdicts": {"0": "converged", "1": "collapsed"}, "verdict_steps": {"0": 30, "1": 40}, "settled": 1,
           "warnings": [], "started_utc": "2026-11-29T17:22:00+00:00", "machine": where, "git_commit": "abc1234"}
    text = report({"default-fit-input": fit})
    assert "| default-fit-input | 0 | 600 | 600 |" in text and "| default-fit-hidden | not run |" in text
    assert "(commit abc1234): 10 minutes of fitting (2 epochs, 40 steps), 1 of 2 depths settled" in text
    assert "several runs" in text and "took 2 minutes" in text and "| 1 | collapsed | 40 | - | - | - | - |" in text
    assert "several runs" not in report({"default-fit-input": {**fit, "this_run_wall_seconds": 610.0}})
    # the read-out on dev beside each verdict, its KL against 1.25 x the fit's eps
    dev = {"0": {"kl": 0.12, "agreement": 0.9, "l0": 0.5}, "1": {"kl": 0.13, "agreement": 0.8, "l0": 0.0}}
    text = report({"default-fit-input": {**fit, "eps": 0.1, "dev_sentences": 5, "dev": dev}})
    assert "on all 5 SST dev sentences" in text
    assert "| 0 | converged | 30 | 0.1200 | yes | 0.900 | 0.500 |" in text
    assert "| 1 | collapsed | 40 | 0.1300 | **no** | 0.800 | 0.000 |" in text


def test_the_break_even_is_the_fit_over_what_each_sentence_saves_and_never_when_nothing_is_saved():
    fits = {"one depth": {"seconds": 300.0}, "every depth": {"seconds": 1200.0}}
    per_sentence = {"DiffMask, one depth": 0.01, "DiffMask, every depth": 0.02, "Occlusion, one depth": 0.16,
                    "Occlusion, every depth": 1.22, "IntegratedGradients, one depth": 0.005,
                    "IntegratedGradients, every depth": 2.42}
    even = break_even(fits, per_sentence, ["Occlusion", "IntegratedGradients"])
    assert even["one depth"]["Occlusion"] == pytest.approx(300 / 0.15)
    assert even["every depth"]["Occlusion"] == pytest.approx(1000.0)
    assert even["every depth"]["IntegratedGradients"] == pytest.approx(500.0)
    assert even["one depth"]["IntegratedGradients"] is None  # the peer is cheaper per sentence: never
    where = {"cpu": "CPU X", "cores": 2, "load_1min": 0.5, "pip_env": {}}
    cost = {"sentences_timed": 64, "peers": {"Occlusion": {}, "IntegratedGradients": {"n_steps": 50}}, "top_depth": 6,
            "fits": {depth: {**fit, "verdicts": {"6": "converged"}} for depth, fit in fits.items()},
            "per_sentence_seconds": per_sentence, "break_even": even, "fit_warnings": [], "seconds": 400.0,
            "started_utc": "2026-12-07T10:00:00+00:00", "machine": where, "git_commit": "abc1234"}
    text = report({"explaining-cost": cost})
    assert "| every depth | 1200 | 6 converged | 0.0200 | 1.220 | 1,000 | 2.420 | 500 |" in text
    assert "| one depth | 300 | 6 converged | 0.0100 | 0.160 | 2,000 | 0.005 | never |" in text
