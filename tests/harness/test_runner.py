"""The benchmark harness: a tiny toy run end to end, and the pieces it is made of."""

import dataclasses
import json
import math
import re

import pytest
import torch

from benchmarks import build_config, run_suite
from benchmarks.__main__ import main
from captum_diffmask.methods import register_method, unregister_method
from benchmarks.runner import load_suite
from benchmarks.records import cache_dir, cached, median_seconds, to_jsonable, write_json

# Small enough for about half a minute on one thread, large enough that the toy
# model learns the task (97% held-out accuracy) and DiffMask's fit converges (on a
# 12-epoch model at 94% it closes every gate instead). DiffMask runs until its fit
# converges (epochs None: fit's budget): JS 0.004-0.008 on three CPU code paths
# (default, MKL_CBWR=COMPATIBLE, AVX2). A cap of 20 epochs stopped it violated, at a
# JS of 0.08-0.13 against the test's bound of 0.11.
TINY = {
    "data": {"num_examples": 3000},
    "model": {"epochs": 20},
    "method_options": {
        "DiffMask": {"epochs": None},
        "IntegratedGradients": {"n_steps": 8},
        "PerSampleBottleneck": {"steps": 8},
        "Guan": {"steps": 8},
        "PerExampleDiffMask": {"steps": 8},
        "REINFORCE": {"steps": 8},
    },
    "diffmask_input": {"stages": [{"layers": [1], "epochs": 1}, {"layers": [0], "epochs": 1, "lr_baseline": 0.0}]},
    "speed": {"batch_size": 50, "repeats": 2, "budget_seconds": 0.2},
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAPTUM_DIFFMASK_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def tiny_run(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    results = run_suite("toy", out, quick=True, overrides=TINY, verbose=False)
    return out, results


def _number(value):
    return math.inf if value == "inf" else value


def test_tiny_run_writes_complete_results(tiny_run):
    out, _ = tiny_run
    text = (out / "results.json").read_text()
    def refuse(constant):
        raise AssertionError(f"bare {constant} in results.json")

    results = json.loads(text, parse_constant=refuse)  # strict: "inf" is a string, NaN is null
    for key in ("suite", "config", "environment", "methods", "paper", "speed"):
        assert key in results, key
    assert results["suite"] == "toy" and results["mode"] == "quick"
    assert results["environment"]["torch"] == torch.__version__
    assert results["environment"]["threads"] == 1
    expected = load_suite("toy").DEFAULTS["methods"]
    assert list(results["methods"]) == expected
    for name, record in results["methods"].items():
        assert record["status"] == "ok", (name, record.get("error"))
        for key in ("js", "js_std", "seconds_per_example", "ratio_to_forward"):
            assert isinstance(record[key], (int, float)) and math.isfinite(record[key]), (name, key, record[key])
        assert 0.0 <= record["js"] <= math.log(2) + 1e-6
        kl = _number(record["kl"])
        assert kl == math.inf or (isinstance(kl, float) and kl >= 0.0), (name, kl)
        assert record["seconds_per_example"] > 0
    # the one-hot / sparse methods are the only ones allowed an infinite KL
    for name in ("DiffMask", "Random", "IntegratedGradients", "PerSampleBottleneck", "Guan"):
        assert math.isfinite(results["methods"][name]["kl"]), name
    assert results["paper"]["ExactErasure"]["kl"] == "inf"
    assert results["paper"]["DiffMask"]["js"] == 0.0


def test_tiny_run_diffmask_beats_chance(tiny_run):
    _, results = tiny_run
    methods = results["methods"]
    assert results["models"][0]["accuracy"] >= 0.9
    assert methods["DiffMask"]["js"] < 0.5 * methods["Random"]["js"], (methods["DiffMask"]["js"], methods["Random"]["js"])
    assert methods["DiffMask"]["kl"] < methods["Random"]["kl"]
    # amortised: attributing costs about a forward pass, far less than 8-step IG
    assert methods["DiffMask"]["seconds_per_example"] < methods["IntegratedGradients"]["seconds_per_example"]


def test_tiny_run_writes_report_and_figures(tiny_run):
    out, results = tiny_run
    report = (out / "report.md").read_text()
    for name in results["methods"]:
        assert f"`{name}`" in report
    for section in ("## Scores", "## Speed", "## Figures", "## What each choice was made on", "## Configuration",
                    "## Environment", "## Reproduce"):
        assert section in report
    # the runner writes what the suite declares each choice was made on
    assert results["chosen_on"] == load_suite("toy").CHOSEN_ON
    assert "| model epoch | `train` |" in report
    assert "0.27" in report and "0.18" in report  # the paper's numbers beside ours
    files = [figure["file"] for figure in results["figures"]]
    assert files == ["figures/toy_attributions.png", "figures/toy_hidden_states.png"]
    for file in files:
        data = (out / file).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"]({file})" in report


class Boom:
    summary = "always fails"

    def __init__(self, model, padding_mask_arg="auto"):
        pass

    def attribute(self, inputs, target=None, additional_forward_args=None, layer=0):
        raise RuntimeError("boom")


class Missing(Boom):
    summary = "needs a package that is not installed"

    def __init__(self, model, padding_mask_arg="auto"):
        raise ImportError("Missing needs the package nowhere_to_be_found")


@pytest.fixture
def failing_methods():
    for cls in (Boom, Missing):
        register_method(cls)
    yield
    for cls in (Boom, Missing):
        unregister_method(cls.__name__)


def test_a_failing_method_is_reported_not_raised(cache, tmp_path, failing_methods):
    overrides = dict(TINY, figures=False)
    results = run_suite("toy", tmp_path, quick=True, methods=["Random", "Boom", "Missing"],
                        overrides=overrides, verbose=False)
    # same data and model configuration as the tiny run: the model comes from the cache
    assert results["models"][0]["cached"] is True
    assert results["methods"]["Random"]["status"] == "ok"
    assert results["methods"]["Boom"]["status"] == "failed"
    assert "RuntimeError: boom" in results["methods"]["Boom"]["error"]
    assert results["methods"]["Missing"]["status"] == "unavailable"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["methods"]["Boom"]["js"] is None  # NaN is written as null
    report = (tmp_path / "report.md").read_text()
    assert "RuntimeError: boom" in report and "`Missing` (unavailable)" in report
    assert "nowhere_to_be_found" in results["methods"]["Missing"]["error"]
    # the report written again from the JSON alone is the same text
    (tmp_path / "report.md").unlink()
    assert main(["report", str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "report.md").read_text() == report
    assert main(["report", str(tmp_path / "nothing.json")]) == 2


def test_build_config_merges_quick_overrides_seeds_and_methods():
    suite = load_suite("toy")
    config = build_config(suite, quick=True, seeds=2, methods=["Random", "DiffMask"],
                          overrides={"data": {"num_examples": 500}})
    assert config["seeds"] == [0, 1] and config["quick"] is True
    assert config["methods"] == ["Random", "DiffMask"]
    assert config["data"] == {**suite.DEFAULTS["data"], "num_examples": 500}
    ig = config["method_options"]["IntegratedGradients"]
    assert ig["n_steps"] == suite.QUICK["method_options"]["IntegratedGradients"]["n_steps"]  # quick wins
    assert ig["chunk"] == suite.DEFAULTS["method_options"]["IntegratedGradients"]["chunk"]  # the rest stays
    full = build_config(suite)
    assert full["seeds"] == [0, 1, 2] and full["method_options"]["IntegratedGradients"]["n_steps"] == 500
    assert suite.DEFAULTS["seeds"] == [0, 1, 2]  # merging did not touch the defaults
    with pytest.raises(ValueError, match="methods"):
        build_config(suite, methods=["NoSuchMethod"])
    with pytest.raises(ValueError, match="methods"):  # another suite's own row
        build_config(suite, methods=["REINFORCE-corrected"])
    erasure = load_suite("sst-erasure")  # its own rows are accepted beside the registry's methods
    assert build_config(erasure, methods=["REINFORCE-corrected", "Random"])["methods"] == ["REINFORCE-corrected", "Random"]
    with pytest.raises(ValueError, match="seeds"):
        build_config(suite, seeds=0)
    with pytest.raises(ValueError, match="suite"):
        load_suite("nope")


def test_cli(capsys, tmp_path):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "toy" in out and "DiffMask" in out and "Random" in out
    assert main(["run", "toy", "--out", str(tmp_path), "--methods", "NoSuchMethod"]) == 2
    assert "NoSuchMethod" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "toy"])  # --out is required


@pytest.mark.parametrize("raises", [False, True])
def test_a_run_in_a_log_shows_the_fits_lines_and_leaves_the_logger_as_found(capsys, monkeypatch, tmp_path, raises):
    import logging

    import benchmarks.runner as runner

    def run_suite(*args, **kwargs):
        logging.getLogger("captum_diffmask").info("DiffMask fit epoch 1/-, layer 0: a line")
        if raises:
            raise ValueError("suite: a refusal")

    logger = logging.getLogger("captum_diffmask")
    handlers, level = list(logger.handlers), logger.level
    monkeypatch.setattr(runner, "run_suite", run_suite)
    assert main(["run", "toy", "--out", str(tmp_path)]) == (2 if raises else 0)
    err = capsys.readouterr().err
    assert re.search(r"^\d\d:\d\d:\d\d DiffMask fit epoch 1/-, layer 0: a line$", err, re.M)
    assert logger.handlers == handlers and logger.level == level
    assert main(["run", "toy", "--out", str(tmp_path), "--quiet"]) == (2 if raises else 0)
    assert "a line" not in capsys.readouterr().err


def test_cache_reuses_until_the_key_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    calls = []

    def build():
        calls.append(1)
        return {"weights": torch.arange(3.0)}

    first, hit1 = cached("thing", {"a": 1}, build)
    second, hit2 = cached("thing", {"a": 1}, build)
    third, hit3 = cached("thing", {"a": 2}, build)
    assert (hit1, hit2, hit3) == (False, True, False) and len(calls) == 2
    assert torch.equal(second["weights"], torch.arange(3.0))
    assert len(list((tmp_path / "c").glob("thing-*.pt"))) == 2
    cached("thing", {"a": 1}, build, use_cache=False)
    assert len(calls) == 3
    monkeypatch.delenv("CAPTUM_DIFFMASK_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "captum_diffmask")


def test_json_conventions(tmp_path):
    value = {"a": math.inf, "b": math.nan, "c": (1, 2.5), "d": torch.tensor([1.0, math.inf])}
    assert to_jsonable(value) == {"a": "inf", "b": None, "c": [1, 2.5], "d": [1.0, "inf"]}
    write_json(value, tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text())["a"] == "inf"


def test_median_seconds_counts_and_budget():
    calls = []
    median, n = median_seconds(lambda: calls.append(1), repeats=4, budget_seconds=10.0, warmup=True)
    assert n == 4 and len(calls) == 5 and median >= 0
    median, n = median_seconds(lambda: sum(range(10_000)), repeats=100, budget_seconds=0.0, warmup=False)
    assert n == 1  # a spent budget still gives one timed call


def test_aggregate_over_seeds():
    from benchmarks.suites.toy import aggregate

    def record(seed, js, kl):
        return {"seed": seed, "js": js, "kl": kl, "js_std_examples": 0.1, "kl_std_examples": 0.2,
                "kl_finite": kl if math.isfinite(kl) else 0.5, "kl_inf_share": 0.0, "setup_seconds": 1.0,
                "attribute_seconds": 2.0, "unscored": 0}

    result = aggregate([record(0, 0.1, 1.0), record(1, 0.3, math.inf), record(2, 0.2, 2.0)],
                       {"seconds_per_example": 0.5, "ratio_to_forward": 3.0}, {"steps": 5})
    assert result["status"] == "ok" and result["seeds_ok"] == 3
    assert result["js"] == pytest.approx(0.2) and result["js_std"] == pytest.approx(0.1)  # sample std of seeds
    assert result["kl"] == math.inf  # one infinite seed makes the mean infinite, as the paper's table
    assert result["seconds_per_example"] == 0.5 and result["options"] == {"steps": 5}
    partial = aggregate([record(0, 0.1, 1.0), {"seed": 1, "status": "failed", "error": "E: x"}], None, {})
    assert partial["js"] == pytest.approx(0.1) and partial["js_std"] == 0.0 and "seeds [1]" in partial["error"]
    failed = aggregate([{"seed": 0, "status": "failed", "error": "E: x"}], None, {})
    assert failed["status"] == "failed" and math.isnan(failed["js"])


def test_set_options_become_overrides_and_unknown_settings_are_refused():
    from benchmarks.__main__ import parse_settings
    from benchmarks.runner import build_config, load_suite

    overrides = parse_settings(['fit={"optimizer": "rmsprop"}', "data_seeds=[101, 102]", 'fit={"lr": 0.001}'])
    assert overrides == {"fit": {"optimizer": "rmsprop", "lr": 0.001}, "data_seeds": [101, 102]}
    config = build_config(load_suite("toy-robustness"), overrides=overrides)
    assert config["fit"] == {"eps": 0.05, "optimizer": "rmsprop", "lr": 0.001}  # merged into the suite's
    with pytest.raises(ValueError, match="KEY=JSON"):
        parse_settings(["fit"])
    with pytest.raises(ValueError, match="--set fit: the value is not JSON"):
        parse_settings(["fit={optimizer: rmsprop}"])
    with pytest.raises(ValueError, match="overrides: fits is not a setting of this suite"):
        build_config(load_suite("toy-robustness"), overrides={"fits": {}})


def test_a_toy_model_is_not_chosen_on_the_held_out_set_it_is_scored_on():
    from benchmarks.suites.toy import load_toy_model, seed_data, stopping_data

    config = build_config(load_suite("toy"), True, None, None,
                          {"data": {"num_examples": 600, "stopping_examples": 200}, "model": {"epochs": 3},
                           "cache": False})
    train, valid = seed_data(config, 0)
    flipped = dataclasses.replace(valid, labels=1 - valid.labels)  # a held-out set that would pick other epochs
    first, info = load_toy_model(config, 0, train, valid, verbose=False)
    second, flipped_info = load_toy_model(config, 0, train, flipped, verbose=False)
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name]), name
    # the accuracy reported is the held-out set's, the stopping examples' beside it
    assert info["accuracy"] + flipped_info["accuracy"] == pytest.approx(1.0)
    assert info["stopping_accuracy"] == flipped_info["stopping_accuracy"]
    stopping = stopping_data(config["data"], 0)
    assert len(stopping) == 200 and not torch.equal(stopping.ids[:50], valid.ids[:50])
