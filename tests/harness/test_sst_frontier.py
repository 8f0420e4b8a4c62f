"""The masked share against the macro-F1 change over eps (benchmarks.studies.sst_frontier),
from sweeps fitted at some layers only (benchmarks.studies.sst_sweep with ``layers``)."""

import json

import pytest

from benchmarks.studies import sst_frontier, sst_sweep
from tiny_models import needs_sst

BASE = {
    "train_sentences": 96,
    "model": {"source": "tiny", "epochs": 1, "batch_size": 16, "lr": 1e-3},
    "diffmask": {"validation_sentences": 24, "batch_size": 16, "select_checkpoint": False, "epochs": None,
                 "max_steps": 4, "multiplier": "pi", "constraint": "deployed", "layers": [1]},
    "cache": False,
}


def _record(mode, eps, rows, unmasked=50.0):
    return {"mode": mode, "options": {"eps": eps}, "scored_sentences": 100,
            "seeds": [{"seed": 0, "unmasked_f1": unmasked, "per_layer": [
                {"layer": layer, "status": status, "kl": kl, "masked": masked, "f1": f1, "agreement": 90.0}
                for layer, status, kl, masked, f1 in rows]}]}


def test_the_sparsest_counted_probe_within_a_point_is_where_it_stands():
    results = [
        _record("input", 0.01, [(3, "converged", 0.010, 30.0, 49.5)]),
        _record("input", 0.02, [(3, "converged", 0.024, 45.0, 49.2)]),   # counts, within a point: the answer
        _record("input", 0.04, [(3, "converged", 0.045, 60.0, 47.0)]),   # counts, but 3 points lost
        _record("input", 0.08, [(3, "violated", 0.05, 80.0, 49.9)]),     # unsettled: does not count
        _record("input", 0.005, [(3, "converged", 0.009, 70.0, 49.9)]),  # over eps x 1.25: does not count
    ]
    points = sst_frontier.frontier_points(results)
    assert [p["eps"] for p in points["input"]] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert [p["counts"] for p in points["input"]] == [False, True, True, True, False]
    best = sst_frontier.sparsest_within(points["input"])
    assert best["eps"] == 0.02 and best["masked"] == 45.0 and best["f1_change"] == pytest.approx(-0.8)
    text = sst_frontier.frontier_markdown(results, "cmd")
    assert "masks 45.0 % (eps 0.02, layer 3, change -0.80)" in text and "masks 46.3 %" in text
    assert sst_frontier.sparsest_within([p for p in points["input"] if p["eps"] == 0.04]) is None


@needs_sst
def test_a_sweep_fitted_at_one_layer_scores_that_layer_and_feeds_the_frontier(tmp_path):
    spec = {"score_on": "train", "score_sentences": 40, "base": BASE,
            "runs": [{"name": f"hidden, eps {e}", "mode": "hidden", "diffmask": {"eps": e}} for e in (0.01, 0.05)]}
    path, out, report = tmp_path / "sweep.json", tmp_path / "runs.jsonl", tmp_path / "frontier.md"
    path.write_text(json.dumps(spec))
    assert sst_sweep.main([str(path), "--out", str(out), "--quiet", "--threads", "1"]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    for result in results:
        (seed,) = result["seeds"]
        assert [r["layer"] for r in seed["per_layer"]] == [1] and seed["steps_per_layer"] == 4
    assert sst_frontier.main([str(out), "--markdown", str(report)]) == 0
    text = report.read_text()
    assert text.count("| 0.01 | 1 | 0 |") == 1 and text.count("| 0.05 | 1 | 0 |") == 1
    assert "Where it stands:" in text
