"""The side-by-side squad fits (benchmarks/studies/squad_fits.py): the rising
caps, going on from a record, the deadline, and the report."""

import json
import time
from types import SimpleNamespace

import pytest

from benchmarks.studies import squad_fits


def _config():
    return {"seeds": [0], "diffmask": {"max_steps": 1000, "hidden": {"stack_layers": "all"}}}


@pytest.fixture
def fake_fit(monkeypatch):
    r"""A fit whose layers converge at given caps; records the caps it was asked for."""
    calls = []

    def fit_mode(config, bench, mode, seed, verbose):
        cap = config["diffmask"][mode]["max_steps"]
        calls.append((cap, dict(config["diffmask"][mode])))
        statuses = {k: "converged" if cap >= at else "unsettled" for k, at in enumerate(bench.settles_at)}
        return SimpleNamespace(convergence={k: {"status": s} for k, s in statuses.items()}), {}

    monkeypatch.setattr(squad_fits, "fit_mode", fit_mode)
    return calls


def test_caps_rise_until_every_layer_settles(tmp_path, fake_fit):
    bench = SimpleNamespace(settles_at=[200, 700])
    record = squad_fits.fit_in_rising_caps(_config(), bench, "hidden", time.time() + 60, 300, 200, tmp_path)
    assert [cap for cap, _ in fake_fit] == [300, 500, 700]
    assert fake_fit[0][1] == {"stack_layers": "all", "max_steps": 300}  # the mode's own settings kept
    assert record["settled"] and record["settings"] == {"stack_layers": "all", "max_steps": 700}
    assert [lap["statuses"] for lap in record["laps"]][0] == {0: "converged", 1: "unsettled"}
    assert json.loads((tmp_path / "cap-hidden.json").read_text())["settings"]["max_steps"] == 700


def test_caps_stop_at_the_suites_cap_and_at_the_deadline(tmp_path, fake_fit):
    never = SimpleNamespace(settles_at=[10 ** 6])
    record = squad_fits.fit_in_rising_caps(_config(), never, "input", time.time() + 60, 600, 300, tmp_path)
    assert [cap for cap, _ in fake_fit] == [600, 900, 1000] and not record["settled"]
    fake_fit.clear()
    squad_fits.fit_in_rising_caps(_config(), never, "input", time.time() - 1, 100, 100, tmp_path / "late")
    assert [cap for cap, _ in fake_fit] == [100]  # the deadline passed: one cap, then stop


def test_a_second_invocation_goes_on_from_the_last_cap(tmp_path, fake_fit):
    bench = SimpleNamespace(settles_at=[900])
    squad_fits.fit_in_rising_caps(_config(), bench, "input", time.time() - 1, 300, 200, tmp_path)
    squad_fits.fit_in_rising_caps(_config(), bench, "input", time.time() + 60, 300, 200, tmp_path)
    assert [cap for cap, _ in fake_fit] == [300, 500, 700, 900]
    record = json.loads((tmp_path / "cap-input.json").read_text())
    assert [lap["cap"] for lap in record["laps"]] == [300, 500, 700, 900] and record["settled"]
    fake_fit.clear()
    again = squad_fits.fit_in_rising_caps(_config(), bench, "input", time.time() + 60, 300, 200, tmp_path)
    assert fake_fit == [] and again == record  # settled: nothing to fit, the record as it was


def test_the_report_counts_converged_layers_and_sums_the_seconds(tmp_path):
    record = {"settled": False, "settings": {"max_steps": 400},
              "laps": [{"cap": 200, "seconds": 10.0, "statuses": {"0": "unsettled", "1": "violated"}},
                       {"cap": 400, "seconds": 5.5, "statuses": {"0": "converged", "1": "violated"}}]}
    text = squad_fits.laps_markdown({"seed 0": {"input": record}})
    assert "**seed 0, input**: 1 of 2 layers converged at cap 400 (not settled); 15.5 s of fitting over 2 caps." in text
    assert "| 400 | 5.5 s | **converged** | violated |" in text
    (tmp_path / "cap-input.json").write_text(json.dumps(record))
    assert squad_fits.main(["report", f"seed 0={tmp_path}", "--json", str(tmp_path / "runs.json")]) == 0
    assert json.loads((tmp_path / "runs.json").read_text()) == {"seed 0": {"input": record}}
    (tmp_path / "cap-hidden.json").write_text(json.dumps({**record, "settings": {"stack_layers": "all", "max_steps": 9}}))
    assert squad_fits.suite_settings(tmp_path) == {"input": {"max_steps": 400},
                                                   "hidden": {"stack_layers": "all", "max_steps": 9}}


def test_the_recipe_fit_uses_the_suites_paper_recipe_for_the_mode(tmp_path, monkeypatch):
    from benchmarks.runner import build_config, load_suite

    seen = {}

    def fit_mode(config, bench, mode, seed, verbose):
        seen.update(config=config, mode=mode, seed=seed)
        return SimpleNamespace(convergence={0: {"status": "unsettled"}, 1: {"status": "converged"}}), {}

    monkeypatch.setattr(squad_fits, "fit_mode", fit_mode)
    config = build_config(load_suite("squad"))
    record = squad_fits.fit_recipe(config, SimpleNamespace(layers=6), "input", tmp_path)
    options = seen["config"]["diffmask"]
    assert options["optimizer"] == "lookahead-rmsprop" and options["eps"] == 1.0 and options["batch_size"] == 8
    assert options["input"] == {"votes": "tied", "epochs": 7} and seen["seed"] == 0  # one epoch per input depth
    assert record["epochs"] == 7 and record["statuses"] == {0: "unsettled", 1: "converged"}
    assert json.loads((tmp_path / "recipe-input.json").read_text())["epochs"] == 7
    squad_fits.fit_recipe(config, SimpleNamespace(layers=6), "hidden", tmp_path)
    assert seen["config"]["diffmask"]["hidden"] == {"epochs": 4}
