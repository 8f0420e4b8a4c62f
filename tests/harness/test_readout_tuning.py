"""The Readout Bottleneck's learning rate chosen on held-out train sentences: the
rule skips collapsed networks and takes the lowest held-out objective."""

import json

import pytest

from benchmarks.studies import readout_tuning


def _line(lr, loss, shut, suite="sst-erasure"):
    scores = {"steps": 3, "loss": loss, "task": loss - 0.1, "capacity": 2.0, "shut": shut}
    return {"suite": suite, "lr": lr, "options": {"batch_size": 64, "max_steps": 400, "lr": lr},
            "fit_seconds": 10.0, "fit_last": dict(scores), "held_out": scores}


def test_the_rule_takes_the_lowest_held_out_objective_among_networks_not_collapsed():
    lines = [_line(1e-3, 1.0, 1.0), _line(1e-4, 2.1, 0.5), _line(3e-5, 2.3, 0.05)]
    # the collapsed network has the lowest objective here, and is still not chosen
    assert readout_tuning.choose(lines)["lr"] == 1e-4
    assert readout_tuning.choose([_line(1e-3, 1.0, 0.995)]) is None
    table = readout_tuning.summary(lines)
    assert table.splitlines()[2].startswith("| 3e-05 |") and "Chosen: lr 0.0001." in table
    assert "every network collapsed" in readout_tuning.summary([_line(1e-3, 1.0, 1.0)])


def test_the_report_names_the_suite_the_options_and_the_command(tmp_path):
    lines = [_line(1e-4, 2.1, 0.5, suite="sst"), _line(1e-3, 2.0, 0.2, suite="sst")]
    text = readout_tuning.report(lines, tmp_path / "t.jsonl", tmp_path / "t.md")
    assert text.startswith("# The Readout Bottleneck's learning rate for sst,")
    assert '{"batch_size": 64, "max_steps": 400}' in text and "--suite sst" in text and "--lr 0.0001 0.001" in text


def test_an_out_file_of_another_suite_is_refused(tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text(json.dumps(_line(1e-4, 2.1, 0.5, suite="sst")) + "\n")
    with pytest.raises(ValueError, match="--out"):
        readout_tuning.tune(out, [1e-3], 10, 0, False, suite="sst-erasure")
    with pytest.raises(SystemExit):
        readout_tuning.main(["--out", str(out), "--hold-out", "1"])
