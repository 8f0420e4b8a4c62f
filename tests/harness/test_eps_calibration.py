"""The eps-calibration study's report: its bold headline names the chosen eps,
its agreement, the next rung's and the cost against one fit."""

import json
from pathlib import Path

import pytest

from benchmarks.studies.eps_calibration import report


def _data(eps):
    frontier = [{"eps": e, "layer": 1, "agreement": a, "kl": 0.01, "masked": 0.5, "verdict": v, "seconds": 10.0}
                for e, a, v in ((0.05, 0.99, "converged"), (0.2, 0.97, "converged"), (0.5, 0.8, "unsettled"))]
    return {"agreement": 0.95, "ladder": [0.05, 0.2, 0.5], "calibration": {"eps": eps, "frontier": frontier,
            "reason": "why"}, "chosen_on": {"eps": {"on": "train", "why": "half A"}}, "ladder_seconds": 30.0, "one_fit_seconds": 20.0,
            "environment": {"threads": 2, "cpu": "CPU"},
            "unseen": {"agreement": 0.98, "kl": 0.01, "l0": 0.5, "js_to_ground_truth": 0.002}}


def test_the_headline_names_the_choice_the_next_rung_and_the_cost():
    text = report(_data(0.2), "python -m benchmarks study eps-calibration --markdown x.md")
    assert ("**A target of 0.95 picks eps 0.2: held-out agreement 0.970 there, 0.800 at the next rung, eps 0.5; "
            "the ladder took 1.5x one fit**") in text
    assert "| 0.5 | 0.800 | 0.0100 | 0.500 | unsettled | 10 |" in text and "Every choice was made on half A" in text
    none = _data(None)
    del none["unseen"], none["one_fit_seconds"]
    assert "**No rung of the ladder keeps 95% of the predictions**" in report(none, "cmd")


def test_the_sst_report_sets_the_calibration_beside_the_suites_frontier():
    from benchmarks.studies.eps_calibration import _suite_frontier

    before = _suite_frontier("input", 3)
    assert [row["eps"] for row in before] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert before[1]["agreement"] == pytest.approx(0.925) and before[1]["masked"] == pytest.approx(0.2312)  # shares
    data = {**_data(0.2), "task": "sst", "mode": "input", "layer": 3, "frontier_before": before}
    del data["unseen"]["js_to_ground_truth"]
    text = report(data, "python -m benchmarks study eps-calibration --task sst --markdown x.md")
    assert text.startswith("# calibrate_eps on the SST MiniLM") and "No dev sentence is read. Input mode, layer 3." in text
    assert "On the suite's 400 validation sentences, the chosen probe keeps the prediction on 0.980" in text
    assert "## Beside the suite's frontier" in text and "| 0.01 | 0 | 0.925 | 0.231 | converged | 669 |" in text


def test_the_committed_sst_calibration_meets_its_target_on_train_sentences_within_its_cost():
    # docs/results/eps-calibration-sst.json, the run the guide quotes: the chosen rung keeps the target and
    # settled, the next looser rung walked misses it, the ladder costs at most 1.5x one fit, nothing from dev
    data = json.loads((Path(__file__).resolve().parents[2] / "docs/results/eps-calibration-sst.json").read_text())
    rows = {row["eps"]: row for row in data["calibration"]["frontier"]}
    chosen = data["calibration"]["eps"]
    assert rows[chosen]["agreement"] >= data["agreement"] and rows[chosen]["verdict"] in ("converged", "needed")
    looser = min(eps for eps in rows if eps > chosen)
    assert rows[looser]["agreement"] < data["agreement"]
    assert data["ladder_seconds"] <= 1.5 * data["one_fit_seconds"]
    assert data["chosen_on"]["eps"]["on"] == "train" and data["unseen"]["agreement"] >= data["agreement"]
