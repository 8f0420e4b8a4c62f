"""The Readout Bottleneck's learning rate and beta chosen on held-out train
sentences: the rule skips collapsed networks and those that do not keep the
prediction, takes the largest beta left and at it the lowest held-out objective."""

import json

import pytest
import torch

from benchmarks.studies import readout_tuning


def _line(lr, loss, shut, suite="sst-erasure", agreement=0.95, beta_mean=10.0):
    scores = {"steps": 3, "loss": loss, "task": loss - 0.1, "capacity": 2.0, "shut": shut, "agreement": agreement}
    return {"suite": suite, "lr": lr, "beta_mean": beta_mean, "options": {"batch_size": 64, "max_steps": 400, "lr": lr},
            "fit_seconds": 10.0, "fit_last": dict(scores), "held_out": scores}


def test_the_rule_takes_the_lowest_held_out_objective_among_networks_not_collapsed():
    lines = [_line(1e-3, 1.0, 1.0), _line(1e-4, 2.1, 0.5), _line(3e-5, 2.3, 0.05)]
    # the collapsed network has the lowest objective here, and is still not chosen
    assert readout_tuning.choose(lines)["lr"] == 1e-4
    assert readout_tuning.choose([_line(1e-3, 1.0, 0.995)]) is None
    table = readout_tuning.summary(lines)
    assert table.splitlines()[2].startswith("| sampled | 10 | 3e-05 |") and "Chosen: lr 0.0001, beta 10 / H, target sampled." in table
    assert "Chosen: none" in readout_tuning.summary([_line(1e-3, 1.0, 1.0)])


def test_the_rule_takes_the_largest_beta_that_keeps_the_prediction():
    lines = [_line(1e-4, 1.9, 0.8, agreement=0.13), _line(1e-4, 1.2, 0.3, agreement=0.93, beta_mean=1.0),
             _line(1e-3, 1.1, 0.3, agreement=0.91, beta_mean=1.0), _line(1e-4, 0.9, 0.1, agreement=0.99, beta_mean=0.1)]
    # beta 10 passes no information (agreement 0.13); beta 1 keeps the prediction and is the largest that does;
    # at it the lowest held-out objective (the objectives of two betas do not compare)
    chosen = readout_tuning.choose(lines)
    assert (chosen["beta_mean"], chosen["lr"]) == (1.0, 1e-3)
    first_grid = dict(lines[1], held_out={k: v for k, v in lines[1]["held_out"].items() if k != "agreement"})
    assert readout_tuning.choose([first_grid]) is None  # a line without the agreement is not eligible
    assert "| not measured |" in readout_tuning.summary([first_grid])
    # the networks of another target do not compete: their objectives are another task's
    predicted = dict(lines[3], options={**lines[3]["options"], "target": "predicted"})
    assert readout_tuning.choose(lines[:3] + [predicted], target="predicted") is predicted
    assert readout_tuning.choose(lines[:3] + [predicted], target="sampled")["beta_mean"] == 1.0


def test_the_report_names_the_suite_the_options_and_the_command(tmp_path):
    lines = [_line(1e-4, 2.1, 0.5, suite="sst"), _line(1e-3, 2.0, 0.2, suite="sst")]
    text = readout_tuning.report(lines, tmp_path / "t.jsonl", tmp_path / "t.md")
    assert text.startswith("# The Readout Bottleneck's learning rate and beta for sst,")
    assert '{"batch_size": 64, "max_steps": 400}' in text and "--suite sst" in text and "--lr 0.0001 0.001" in text
    assert "What information costs the objective" not in text
    (tmp_path / "t-information.json").write_text(json.dumps([
        {"lambda": 0.9, "sampled": 1.088, "predicted": 0.658, "agreement": 0.966, "capacity": 848.2, "beta_capacity": 22.089}]))
    text = readout_tuning.report(lines, tmp_path / "t.jsonl", tmp_path / "t.md")
    assert "| 0.9 | 1.088 | 0.658 | 0.966 | 848.2 | 22.089 |" in text


def test_an_out_file_of_another_suite_is_refused(tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text(json.dumps(_line(1e-4, 2.1, 0.5, suite="sst")) + "\n")
    with pytest.raises(ValueError, match="--out"):
        readout_tuning.tune(out, [1e-3], 10, 0, False, suite="sst-erasure")
    with pytest.raises(SystemExit):
        readout_tuning.main(["--out", str(out), "--hold-out", "1"])


def test_information_costs_capacity_that_falls_with_the_share_let_through(monkeypatch):
    from benchmarks.tasks.sst_bert import EncodedSST
    from tiny_models import sensitized, tiny_bert, token_batch

    ids, mask = token_batch(batch=12, length=7, seed=2)
    data = EncodedSST(ids, mask, ids[:, 0] % 3, torch.zeros_like(ids), [None] * 12)
    model = sensitized(tiny_bert())
    setup = (model, data, {"batch_size": 4}, {"sites": lambda: None, "padding_mask_arg": "auto"}, {})
    monkeypatch.setitem(readout_tuning.SUITES, "tiny", lambda seed, verbose: setup)
    rows = readout_tuning.information_cost("tiny", hold_out=2, seed=0)
    assert [r["lambda"] for r in rows] == list(readout_tuning.UNIFORM_LAMBDAS) and rows[0]["sentences"] == 6
    assert rows[0]["agreement"] == 1.0  # every element let through: the model itself
    capacities = [r["capacity"] for r in rows]
    assert capacities == sorted(capacities, reverse=True) and capacities[-1] == 0.0 and capacities[0] > 100
    assert rows[1]["beta_capacity"] == pytest.approx(10.0 / 32 * rows[1]["capacity"])
    assert "| 0.5 |" in readout_tuning.information_table(rows)
