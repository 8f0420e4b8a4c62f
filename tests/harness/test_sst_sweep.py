"""The DiffMask settings sweep on the sst suite's model (benchmarks.studies.sst_sweep), on a
config-built tiny BERT and a few dozen real SST sentences."""

import inspect
import json
from pathlib import Path

import pytest
import torch

from benchmarks.studies import sst_sweep
from benchmarks.suites import sst as suite
from benchmarks.common.minilm.fitting import changed_predictions, macro_f1_change_interval, SUITE_KEYS, top2_gap
from benchmarks.tasks import sst_bert
from captum_diffmask import DiffMask
from captum_diffmask.diffmask.fit.options import FLAT_NAMES
from captum_diffmask.diffmask.constrained.convergence import STATUSES
from tiny_models import needs_sst


BASE = {
    "train_sentences": 96,
    "model": {"source": "tiny", "epochs": 1, "batch_size": 16, "lr": 1e-3},
    "diffmask": {"validation_sentences": 24, "batch_size": 16, "eps_valid": 10.0, "agreement_valid": 0.0},
    "cache": False,
}


def test_sweep_config_overrides_the_mode_options_only():
    config = sst_sweep.sweep_config(BASE, {"mode": "hidden", "diffmask": {"epochs": 3, "init_bias": 0.0}})
    assert config["diffmask"]["hidden"]["epochs"] == 3 and config["diffmask"]["hidden"]["init_bias"] == 0.0
    assert config["diffmask"]["hidden"]["eps"] == sst_sweep.SWEEP_DIFFMASK["hidden"]["eps"]  # kept
    assert config["diffmask"]["input"] == sst_sweep.SWEEP_DIFFMASK["input"]
    # the sweep's base, not the suite's settings of today: the committed sweep files were written against it
    assert config["diffmask"]["epochs"] == 2 and config["diffmask"]["multiplier"] == "damped"
    assert config["diffmask"]["votes"] == "tied" and "max_steps" not in config["diffmask"]
    assert config["model"]["source"] == "tiny"  # the base merged in
    with pytest.raises(ValueError, match="runs: mode must be"):
        sst_sweep.sweep_config(BASE, {"name": "x", "mode": "both"})
    with pytest.raises(ValueError, match="runs: readout must be"):
        sst_sweep.sweep_config(BASE, {"name": "x", "mode": "input", "readout": "expected"})


@needs_sst
def test_sweep_runs_and_reports_per_layer_results(tmp_path):
    spec = {"base": BASE, "runs": [
        {"name": "hidden-2", "mode": "hidden", "seeds": [0, 1], "diffmask": {"epochs": 2}},
        {"name": "input-1", "mode": "input", "train_sentences": 48, "diffmask": {"epochs": 1}},
    ]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "out" / "runs.jsonl"
    assert sst_sweep.main([str(path), "--out", str(out), "--quiet", "--threads", "1"]) == 0
    hidden, inputs = [json.loads(line) for line in out.read_text().splitlines()]
    assert hidden["name"] == "hidden-2" and hidden["options"]["epochs"] == 2
    settings = suite.DEFAULTS["diffmask"]
    assert hidden["options"]["eps"] == {**settings, **settings["hidden"]}["eps"]  # the mode's own wins where it has one
    assert [s["seed"] for s in hidden["seeds"]] == [0, 1]
    assert 0.0 <= hidden["stability"] <= 0.5  # std of two values in [0, 1]
    assert inputs["stability"] is None and inputs["train_sentences"] == 48 and inputs["options"]["epochs"] == 1
    for result, epochs in ((hidden, 2), (inputs, 1)):
        for seed in result["seeds"]:
            layers = seed["per_layer"]
            assert [r["layer"] for r in layers] == list(range(len(layers))) and len(layers) >= 2
            assert all(0.0 <= r["masked"] <= 100.0 and 0.0 <= r["f1"] <= 100.0 for r in layers)
            # macro-F1 is the mean of the five classes' F1 (each rounded to 0.01)
            assert all(len(r["class_f1"]) == 5 and r["f1"] == pytest.approx(sum(r["class_f1"]) / 5, abs=0.01)
                       for r in layers)
            assert seed["unmasked_f1"] == pytest.approx(sum(seed["unmasked_class_f1"]) / 5, abs=0.01)
            assert 0.0 <= seed["unmasked_median_top2_gap"] <= 1.0
            # the changed predictions are those the agreement does not count
            for r in layers:
                assert r["changed"]["count"] == round((100.0 - r["agreement"]) / 100.0 * result["scored_sentences"])
                low, high = r["f1_change_interval"]
                assert low <= r["f1"] - seed["unmasked_f1"] + 0.02 and high >= r["f1"] - seed["unmasked_f1"] - 0.02
            assert seed["mean_masked"] == pytest.approx(sum(r["masked"] for r in layers) / len(layers))
            assert [row[0] for row in seed["valid_by_epoch"]] == list(range(1, epochs + 1))
            assert seed["steps_per_layer"] > 0


@needs_sst
def test_seeds_fitted_apart_into_the_cache_are_scored_together(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    spec = {"base": BASE, "runs": [{"name": "hidden", "mode": "hidden", "seeds": [7], "diffmask": {"epochs": 1}}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(spec))
    for seed in ("0", "1"):  # as two processes would, one seed each; nothing scored
        assert sst_sweep.main([str(path), "--fit-only", "--seeds", seed, "--quiet", "--threads", "1"]) == 0
    assert "hidden, seed 1: {0: " in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("diffmask-fit-hidden-seed*.pt"))) == 2
    out = tmp_path / "runs.jsonl"
    assert sst_sweep.main([str(path), "--cache", "--seeds", "0", "1", "--out", str(out), "--quiet", "--threads", "1"]) == 0
    result = json.loads(out.read_text())
    assert [s["seed"] for s in result["seeds"]] == [0, 1] and result["stability"] is not None
    assert all(s["fitted"].startswith("fit cache (commit") for s in result["seeds"])  # read, not refitted
    with pytest.raises(SystemExit):
        sst_sweep.main([str(path), "--quiet"])  # --out is needed to score


@needs_sst
def test_sweep_without_selection_reports_verdicts_and_the_held_out_read_out(tmp_path):
    spec = {"base": BASE, "runs": [{"name": "hidden, defaults", "mode": "hidden", "diffmask": {
        "select_checkpoint": False, "epochs": None, "max_steps": 6, "multiplier": "pi", "constraint": "deployed"}}]}
    path, out, report = tmp_path / "sweep.json", tmp_path / "runs.jsonl", tmp_path / "report.md"
    path.write_text(json.dumps(spec))
    assert sst_sweep.main([str(path), "--out", str(out), "--quiet", "--threads", "1", "--markdown", str(report)]) == 0
    (result,) = [json.loads(line) for line in out.read_text().splitlines()]
    seed = result["seeds"][0]
    assert seed["steps"] == 6 and seed["step_seconds"] > 0 and seed["step_over_forward"] > 0 and seed["peak_rss_gb"] > 0
    assert seed["valid_by_epoch"] == []  # no checkpoint selection: nothing scored per epoch
    for r in seed["per_layer"]:
        assert r["status"] in STATUSES and r["steps"] == 6 and r["kl"] >= 0
        assert r["train_kl"] >= 0 and r["train_kl_deployed"] >= 0
    text = report.read_text()
    layers = len(seed["per_layer"])
    assert f"of {layers} probes** ended with a verdict" in text and "held-out KL (<= 0.0125)" in text
    assert text.count("| **") == layers  # one row per layer, its verdict in bold


@needs_sst
def test_sweep_scored_on_train_sentences(tmp_path):
    spec = {"score_on": "train", "score_sentences": 40, "base": BASE,
            "runs": [{"name": "hidden-1", "mode": "hidden", "readout": "louizos", "diffmask": {"epochs": 1}}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "runs.jsonl"
    assert sst_sweep.main([str(path), "--out", str(out), "--quiet", "--threads", "1"]) == 0
    (result,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert result["scored_on"] == "train" and result["scored_sentences"] == 40 and result["readout"] == "louizos"
    assert result["train_sentences"] == BASE["train_sentences"]
    seed = result["seeds"][0]
    assert all(0.0 <= r["f1"] <= 100.0 for r in seed["per_layer"]) and len(seed["valid_by_epoch"]) == 1
    spec["score_on"] = "test"
    path.write_text(json.dumps(spec))
    with pytest.raises(SystemExit):
        sst_sweep.main([str(path), "--out", str(out), "--quiet"])


def _sst_sweeps():
    # the sweeps of benchmarks.studies.sst_sweep (a list of runs); the others are other harnesses'
    paths = sorted((Path(__file__).parents[2] / "benchmarks" / "sweeps").glob("*.json"))
    return [p for p in paths if "runs" in json.loads(p.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("path", _sst_sweeps(), ids=lambda p: p.name)
def test_committed_sweeps_name_known_options(path):
    # the sweeps the docs quote must run as written: a mode, and options that
    # DiffMask's constructor or fit takes (a typo would be passed on and fail late)
    known = set(inspect.signature(DiffMask.__init__).parameters) | set(inspect.signature(DiffMask.fit).parameters)
    known |= set(FLAT_NAMES)  # the suites' flat names of grouped options (benchmarks group them)
    known |= {"batch_size", "lr_lambda_last", *SUITE_KEYS}  # the suite's own
    spec = json.loads(path.read_text(encoding="utf-8"))
    runs = spec["runs"]
    assert runs
    base = spec.get("base", {}).get("diffmask", {})
    for options in [base] + [base[mode] for mode in ("input", "hidden") if mode in base]:
        unknown = set(options) - known - {"input", "hidden"}
        assert not unknown, unknown
    for run in runs:
        sst_sweep.sweep_config(spec.get("base"), run)  # raises on a bad mode
        unknown = set(run.get("diffmask", {})) - known
        assert not unknown, (run["name"], unknown)


def test_the_class_f1_change_is_each_class_against_the_unmasked_model():
    row, seed = {"class_f1": [10.0, 20.0, 30.0, 40.0, 50.0]}, {"unmasked_class_f1": [12.5, 20.0, 29.0, 40.0, 55.0]}
    assert sst_sweep.class_f1_change(row, seed) == "-2.5 / +0.0 / +1.0 / +0.0 / -5.0"
    assert sst_sweep.class_f1_change({}, seed) == "-"  # a record from before the classes were scored


def test_splits_on_train_never_fit_validate_and_score_the_same_sentence(monkeypatch):
    train, dev = [f"train {i}" for i in range(50)], [f"dev {i}" for i in range(20)]
    class Encoded(list):  # stands for EncodedSST: _splits only encodes and takes rows
        def subset(self, rows):
            return Encoded(self[i] for i in rows.tolist())

    monkeypatch.setattr(sst_sweep.sst_bert, "encode_sst", lambda sentences, tokenizer, length: Encoded(sentences))
    config = suite.DEFAULTS | {"diffmask": {**suite.DEFAULTS["diffmask"], "validation_sentences": 8}}
    fit, valid, scored = sst_sweep._splits({"score_on": "train", "score_sentences": 12}, config, train, dev, None, 16)
    assert (len(fit), len(valid), len(scored)) == (30, 8, 12)
    assert set(fit) | set(valid) | set(scored) == set(train)  # a partition of train: dev is never read
    assert len(set(fit) | set(valid) | set(scored)) == len(fit) + len(valid) + len(scored)
    fit_dev, valid_dev, scored_dev = sst_sweep._splits({}, config, train, dev, None, 16)
    assert fit_dev == train and len(scored_dev) == 20 and len(valid_dev) == 8  # the committed sweeps' split
    with pytest.raises(ValueError, match="score_on must be"):
        sst_sweep._splits({"score_on": "test"}, config, train, dev, None, 16)


def test_changed_predictions_say_how_near_a_tie_they_were_and_where_they_went():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.45, 0.45], [0.2, 0.2, 0.6]]))
    torch.testing.assert_close(top2_gap(logits), torch.tensor([0.2, 0.0, 0.4]), atol=1e-6, rtol=0)
    plain = torch.tensor([0, 0, 0, 1, 2, 1])  # class 0 predicted most, then 1, then 2
    masked = torch.tensor([0, 1, 0, 0, 1, 1])  # 0 -> 1 (to a rarer class), 1 -> 0 and 2 -> 1 (to more common ones)
    gap = torch.tensor([0.5, 0.1, 0.5, 0.02, 0.04, 0.5])
    changed = changed_predictions(plain, masked, gap)
    assert changed["count"] == 3 and changed["median_top2_gap"] == pytest.approx(0.04)
    assert changed["toward_more_predicted"] == pytest.approx(200 / 3)
    assert changed_predictions(plain, plain, gap) == {"count": 0, "median_top2_gap": None, "toward_more_predicted": None}
    row = {"changed": changed}
    assert sst_sweep.changed_summary(row) == "0.040, 67 %"
    assert sst_sweep.changed_summary({}) == "-" and sst_sweep.changed_summary({"changed": {"count": 0}}) == "-"


def test_the_macro_f1_change_interval_is_a_paired_bootstrap_over_the_sentences():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (200,), generator=generator)
    plain = torch.where(torch.rand(200, generator=generator) < 0.6, labels, torch.randint(0, 5, (200,), generator=generator))
    assert macro_f1_change_interval(plain, plain, labels, resamples=200) == [0.0, 0.0]  # paired: no change, no spread
    masked = plain.clone()
    masked[:30] = (plain[:30] + 1) % 5  # 30 changed predictions
    low, high = macro_f1_change_interval(plain, masked, labels, resamples=400)
    change = 100.0 * float(sst_bert.class_f1(masked, labels).mean() - sst_bert.class_f1(plain, labels).mean())
    assert low < change < high and high - low > 1.0
    # four times the sentences: about half the width (the interval shrinks as 1 / sqrt(N))
    low4, high4 = macro_f1_change_interval(plain.repeat(4), masked.repeat(4), labels.repeat(4), resamples=400)
    assert 0.35 < (high4 - low4) / (high - low) < 0.65
    row = {"f1_change_interval": [-2.345, 0.5]}
    assert sst_sweep.interval(row) == " [-2.3, +0.5]" and sst_sweep.interval({}) == ""
