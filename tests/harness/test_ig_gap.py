"""Integrated Gradients' completeness-gap study (benchmarks.studies.ig_gap) on a
tiny BERT and a few SST train sentences: a gap per sentence, setting and depth,
the report written with what the tolerance was chosen on."""

import json

from benchmarks.studies import ig_gap
from tiny_models import needs_sst

OVERRIDES = {"train_sentences": 64, "cache": False,
             "model": {"source": "tiny", "epochs": 1, "batch_size": 16, "lr": 1e-3}}


@needs_sst
def test_every_setting_and_depth_has_a_gap_per_sentence(tmp_path):
    out = tmp_path / "gap.md"
    assert ig_gap.main(["--markdown", str(out), "--sentences", "6", "--steps", "8", "--threads", "1",
                        "--set", json.dumps(OVERRIDES)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert {"authors", "defaults", "defaults, 32 steps"} == set(result["gaps"]) and result["tolerance"] == 0.1
    for name, by_depth in result["gaps"].items():
        assert all(len(found) == 6 and min(found) >= 0 for found in by_depth.values())
    assert len(result["gaps"]["defaults"]) >= 2 and len(result["gaps"]["authors"]) == len(result["gaps"]["defaults"])
    over = [k for k, found in result["gaps"]["defaults"].items() if max(found) > 0.1]
    assert sorted(result["gaps"]["defaults, 32 steps"]) == sorted(over)  # rerun where the defaults are over
    assert "SST train" in result["chosen_on"]["tolerance"]
    text = out.read_text()
    assert "| defaults | 0 |" in text and "| authors |" in text and "over 0.1" in text
