"""The per-task SST heads mask study (benchmarks.studies.components_sst_per_task) on a
tiny BERT and a few dozen SST sentences: each run's options reach the fit, every head
is counted in one keep-probability bin, records append, the report renders them all."""

import json

from benchmarks.studies import components_sst_per_task as study
from tiny_models import needs_sst

OVERRIDES = {"sst_suite": {"train_sentences": 96, "model": {"source": "tiny", "epochs": 1, "batch_size": 16, "lr": 1e-3},
                           "diffmask": {"validation_sentences": 24}, "cache": False},
             "train_sentences": 32, "batch_size": 8, "max_steps": 6}


@needs_sst
def test_runs_are_fitted_with_their_options_and_reported(tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps([{"name": "slow", "fit": {"lr": 0.001}}, {"fit": {"max_steps": 4, "l0_floor": 0.0}}]))
    out, report = tmp_path / "runs.jsonl", tmp_path / "report.md"
    assert study.main([str(runs), "--out", str(out), "--threads", "1", "--set", json.dumps(OVERRIDES)]) == 0
    assert study.main([str(runs), "--out", str(out), "--threads", "1", "--set", json.dumps({**OVERRIDES, "max_steps": 2})]) == 0
    assert study.main(["--out", str(out), "--markdown", str(report)]) == 0  # rendered alone, nothing fitted
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4  # appended, not overwritten
    slow, floor = records[:2]
    assert slow["name"] == "slow" and slow["options"]["lr"] == 0.001  # over the per-task lr
    assert floor["name"] == json.dumps({"max_steps": 4, "l0_floor": 0.0}) and floor["options"]["l0_floor"] == 0.0
    assert slow["steps"] == 6 and floor["steps"] == 4 and records[2]["steps"] == 2
    heads = sum(records[0]["heads"].values())  # every head in one bin, the same count every run
    assert heads >= 4 and all(sum(r["heads"].values()) == heads for r in records)
    assert all(list(r["heads"]) == [label for _, label in study.BINS] for r in records)
    # a mask that kept every head (a few steps from open gates) keeps them all on the held-out sentences
    assert all(r["held_out"]["heads_kept"] == heads and r["held_out"]["kl"] == 0 for r in records if r["verdict"] == "open")
    assert all(0 <= r["held_out"]["heads_kept"] <= heads and r["held_out"]["sentences"] == 24 for r in records)
    text = report.read_text()
    assert text.count("| slow |") == 2 and "heads by keep probability (< 0.05 / 0.05-0.5 / 0.5-0.95 / > 0.95)" in text
