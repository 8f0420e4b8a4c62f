"""Choosing the per-example masks' settings on train sentences: the grid, the
rule that picks, and a tiny run that resumes instead of repeating itself."""

import inspect
import json
from pathlib import Path

import pytest

from benchmarks.records import read_json_lines
from benchmarks.studies import sst_erasure_tuning as tuning
from benchmarks.suites import sst_erasure
from captum_diffmask.methods import REINFORCE
from tiny_models import needs_sst, shared_sst

SHARED = shared_sst()


def _line(row, eps, lr, f1):
    return {"row": row, "shared": {"eps": eps}, "per_row": {"lr": lr}, "f1": f1, "optimality": 0.0, "l0": 0.0,
            "sufficiency": 100.0, "constraint_met": 100.0, "seconds": 1.0, "sentences": 10, "searched": 12,
            "options": {"eps": eps, "lr": lr}}


def test_combinations_cover_the_grid_once():
    combos = list(tuning.combinations({"lr": [1, 2], "eps": [0.1, 0.3, 1.0]}))
    assert len(combos) == 6 and len({json.dumps(c, sort_keys=True) for c in combos}) == 6
    assert combos[0] == {"eps": 0.1, "lr": 1} and list(tuning.combinations({})) == [{}]


def test_choose_takes_the_shared_values_with_the_best_mean_f1_each_row_at_its_best_lr():
    lines = [
        _line("A", 0.1, 0.02, 60.0), _line("A", 0.1, 0.05, 70.0), _line("B", 0.1, 0.02, 40.0),  # mean 55
        _line("A", 0.3, 0.02, 65.0), _line("B", 0.3, 0.02, 50.0), _line("B", 0.3, 0.05, 55.0),  # mean 60
        _line("A", 1.0, 0.02, 99.0),  # B never ran at eps 1.0: not a candidate
    ]
    shared, best = tuning.choose(lines, ["A", "B"])
    assert shared == {"eps": 0.3}
    assert best["A"]["per_row"] == {"lr": 0.02} and best["B"]["per_row"] == {"lr": 0.05}
    assert "Chosen shared settings: {\"eps\": 0.3}" in tuning.summary(lines, ["A", "B"])
    with pytest.raises(ValueError, match="every row"):
        tuning.choose(lines[:1], ["A", "B"])


def test_lines_whose_masks_flip_the_class_too_often_never_win():
    lines = [
        _line("A", 0.1, 0.02, 60.0), _line("B", 0.1, 0.02, 50.0),  # mean 55
        {**_line("A", 0.3, 0.02, 90.0), "sufficiency": 80.0}, _line("A", 0.3, 0.05, 52.0),
        _line("B", 0.3, 0.02, 56.0),  # mean 54 without the line that keeps the class on 80 % only
    ]
    assert tuning.choose(lines, ["A", "B"])[0] == {"eps": 0.3}  # no floor: the 90 wins
    shared, best = tuning.choose(lines, ["A", "B"], min_sufficiency=95.0)
    assert shared == {"eps": 0.1} and best["A"]["f1"] == 60.0


@needs_sst
def test_a_tiny_grid_runs_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    lines = (SHARED / "train.txt").read_text(encoding="utf-8").split("\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    (data / "dev.txt").write_text("\n".join(lines[200:240]) + "\n", encoding="utf-8")
    spec = {"base": {"data_dir": str(data), "embeddings": "random", "max_tokens": 15,
                     "model": {"hidden_size": 64, "epochs": 12, "lr": 2e-2, "dropout": 0.0, "phrases": False, "select": "last"},
                     "method_options": {"PerExampleDiffMask": {"steps": 20}, "REINFORCE": {"steps": 20}}},
            "rows": ["PerExampleDiffMask", "REINFORCE"], "shared": {"eps": [0.3]}, "per_row": {"lr": [0.05, 0.1]}}
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(spec), encoding="utf-8")
    out = tmp_path / "tuning.jsonl"
    assert tuning.main([str(grid), "--out", str(out), "--sentences", "12"]) == 0
    first = read_json_lines(out)
    assert len(first) == 4 and {(x["row"], x["per_row"]["lr"]) for x in first} == {
        ("PerExampleDiffMask", 0.05), ("PerExampleDiffMask", 0.1), ("REINFORCE", 0.05), ("REINFORCE", 0.1)}
    for x in first:
        assert x["options"]["eps"] == 0.3 and x["options"]["steps"] == 20 and 0 <= x["f1"] <= 100
        assert x["sentences"] <= x["searched"] <= 12
    assert tuning.main([str(grid), "--out", str(out), "--sentences", "12"]) == 0  # nothing new to run
    assert read_json_lines(out) == first
    capsys.readouterr()
    assert tuning.main([str(grid), "--out", str(out), "--summary"]) == 0
    assert "Chosen shared settings" in capsys.readouterr().out


def test_the_committed_grid_names_known_rows_and_options():
    spec = json.loads((Path(__file__).parents[2] / "benchmarks" / "sweeps" / "sst-erasure-class.json").read_text())
    assert set(spec["rows"]) <= set(sst_erasure.MASK_METHODS)
    known = set(inspect.signature(REINFORCE.fit_masks).parameters) | set(inspect.signature(REINFORCE.__init__).parameters)
    assert set(spec["shared"]) | set(spec["per_row"]) <= known
    # the committed results are this grid's: every row at every point, on train sentences
    lines = read_json_lines(Path(__file__).parents[2] / "docs" / "results" / "sst-erasure-class-tuning.jsonl")
    expected = len(spec["rows"]) * len(list(tuning.combinations(spec["shared"]))) * len(list(tuning.combinations(spec["per_row"])))
    assert len(lines) == expected == 27
    shared, best = tuning.choose(lines, spec["rows"], spec["min_sufficiency"])
    assert all(best[row]["sufficiency"] >= 95.0 for row in spec["rows"])
    options = sst_erasure.DEFAULTS["method_options"]
    for row in spec["rows"]:  # the suite's settings are the tuning's choice
        assert {**shared, **best[row]["per_row"]}.items() <= options[row].items(), row
