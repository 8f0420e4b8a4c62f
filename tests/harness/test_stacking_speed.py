"""The stacked-passes timing study (benchmarks.studies.stacking_speed) on a tiny BERT
and a few dozen SST sentences: both choices timed per mode, the report written."""

import json

from benchmarks.studies import stacking_speed
from tiny_models import needs_sst

OVERRIDES = {"train_sentences": 64, "cache": False,
             "model": {"source": "tiny", "epochs": 1, "batch_size": 16, "lr": 1e-3},
             "diffmask": {"batch_size": 8, "validation_sentences": 16}}


@needs_sst
def test_both_choices_are_timed_per_mode_and_reported(tmp_path):
    out = tmp_path / "speed.md"
    assert stacking_speed.main(["--markdown", str(out), "--steps", "2", "--rounds", "2", "--threads", "1",
                                "--set", json.dumps(OVERRIDES)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert {mode: sorted(v) for mode, v in result["seconds"].items()} == {"input": ["none", "same_site"],
                                                                          "hidden": ["all", "none"]}
    assert all(s > 0 for v in result["seconds"].values() for s in v.values())
    assert result["steps"] == 2 and result["rounds"] == 2 and result["batch_size"] == 8
    text = out.read_text()
    assert "(`same_site`)" in text and "(`all`)" in text and "Load average" in text
