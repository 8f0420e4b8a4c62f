"""The sst-erasure benchmark suite, on a tiny run: a few hundred real SST lines,
random word vectors (no MiniLM needed), a small GRU, few optimisation steps.

The tiny model is trained on its dev sentences too (they are appended to its
train file), so that it predicts varied classes on them and exact erasure has
non-empty optimal sets to compare with; the run checks the plumbing and that
DiffMask's masks beat random words, not generalisation."""

import json
import math

import pytest
import torch

from benchmarks import runner
from benchmarks.suites import sst_erasure
from benchmarks.tasks.sst import read_sst
from tiny_models import shared_sst


SHARED = shared_sst()
pytestmark = pytest.mark.skipif(SHARED is None, reason="SST train.txt/dev.txt not found in ../shared/data beside the checkout")

TINY = {
    "seeds": [0],
    "embeddings": "random",
    "random_dim": 32,
    "max_words": 15,
    "max_sentences": 40,
    "model": {"hidden_size": 64, "epochs": 12, "lr": 2e-2, "dropout": 0.0, "select": "last"},
    "erasure": {"budget": 5000},
    "method_options": {
        "PerExampleDiffMask": {"steps": 150, "eps": 0.3},
        "REINFORCE": {"steps": 150, "eps": 0.3},
        "DiffMask": {"epochs": 2},
        "IntegratedGradients": {"n_steps": 8},
        "PerSampleBottleneck": {"steps": 20},
        "Guan": {"steps": 20},
    },
    "figure_sentences": 2,
}


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sst") / "sst"
    folder.mkdir()
    train = (SHARED / "train.txt").read_text(encoding="utf-8").split("\n")[:300]
    dev = (SHARED / "dev.txt").read_text(encoding="utf-8").split("\n")[:100]
    (folder / "train.txt").write_text("\n".join(train + dev) + "\n", encoding="utf-8")
    (folder / "dev.txt").write_text("\n".join(dev) + "\n", encoding="utf-8")
    (folder / "test.txt").write_text("\n".join(dev[:30]) + "\n", encoding="utf-8")  # a stand-in for the holdout
    return folder.parent  # the files lie in its sst/ subfolder


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    cache = tmp_path_factory.mktemp("cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("CAPTUM_DIFFMASK_CACHE", str(cache))
    patch.setitem(runner.SUITES, "sst-erasure", "benchmarks.suites.sst_erasure")
    try:
        torch.manual_seed(0)
        results = runner.run_suite("sst-erasure", out, overrides={**TINY, "data_dir": str(tiny_data)}, verbose=False)
    finally:
        patch.undo()
    return results, out, cache


def test_tiny_run_has_complete_results(tiny_run):
    results, out, cache = tiny_run
    stored = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert stored["suite"] == "sst-erasure" and stored["split"] == "dev"
    expected = {"ExactErasure", "PerExampleDiffMask", "REINFORCE", "DiffMask", "IntegratedGradients", "Occlusion",
                "PerSampleBottleneck", "Guan", "Random"}
    assert set(stored["methods"]) == expected
    for name, record in stored["methods"].items():
        assert record["status"] == "ok", (name, record.get("error"))
        for key in ("precision", "recall", "f1", "optimality", "l0", "sufficiency"):
            assert 0.0 <= record[key] <= 100.0, (name, key, record[key])
        assert record["seconds_per_example"] > 0 or name == "ExactErasure"
    erasure = stored["erasure"]
    short = sum(1 for s in read_sst("dev", stored["config"]["data_dir"]) if len(s) <= 15)
    assert erasure["solved"] + erasure["not_solved"] == erasure["sentences"] == min(40, short)
    assert erasure["scored"] == erasure["solved"] - erasure["empty_optimum"] >= 8
    assert sum(erasure["size_histogram"].values()) == erasure["solved"]
    # the top-k methods keep exactly the optimal number of words: their L0 is the optimum's
    for name in ("IntegratedGradients", "Occlusion", "Random"):
        assert stored["methods"][name]["l0"] == pytest.approx(stored["methods"]["ExactErasure"]["l0"], abs=1e-6)
        assert stored["methods"][name]["optimality"] == stored["methods"][name]["sufficiency"]
    assert stored["paper"]["PerExampleDiffMask"]["f1"] == 80.75
    assert (out / "figures" / "sst_kept_words.png").stat().st_size > 10_000
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Per-example masks against exact erasure" in report  # the suite's own report writer
    assert any(cache.glob("sst-gru-*.pt"))  # the GRU went to the cache


def test_diffmask_beats_random_top_k(tiny_run):
    methods = tiny_run[0]["methods"]
    assert methods["PerExampleDiffMask"]["f1"] > methods["Random"]["f1"] + 5.0
    # keeping the prediction: masks optimised for it do much better than random words
    assert methods["PerExampleDiffMask"]["sufficiency"] > methods["Random"]["sufficiency"]


def test_suite_report(tiny_run, tmp_path):
    results = tiny_run[0]
    text = sst_erasure.write_report(results, tmp_path / "report.md")
    assert "## Per-example masks against exact erasure (the paper's Table 2)" in text
    assert "80.75" in text and "32.67" in text  # the paper's numbers beside ours
    assert "| `Random` |" in text and "figures/sst_kept_words.png" in text
    f1 = results["methods"]["PerExampleDiffMask"]["f1"]
    assert f"{f1:.2f}" in text


def test_split_test_reads_test_txt(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    config = runner.merge(sst_erasure.DEFAULTS, {**TINY, "data_dir": str(tiny_data), "split": "test", "max_sentences": None,
                                                 "methods": ["PerExampleDiffMask", "Occlusion", "Random"], "figures": False})
    config["method_options"]["PerExampleDiffMask"]["steps"] = 30
    config["quick"] = False
    results = sst_erasure.run(config, tmp_path, verbose=False)
    assert results["split"] == "test"
    assert results["erasure"]["split_sentences"] == 30  # test.txt, not dev.txt (100 lines)
    assert set(results["methods"]) == {"ExactErasure", "PerExampleDiffMask", "Occlusion", "Random"}
    assert not math.isnan(results["methods"]["Occlusion"]["f1"])
    assert "test_accuracy_evaluated" in results["model"]
    with pytest.raises(ValueError, match="split"):
        sst_erasure.run({**config, "split": "validation"}, tmp_path, verbose=False)


def test_per_example_masks_run_once_per_seed(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    config = runner.merge(sst_erasure.DEFAULTS, {**TINY, "data_dir": str(tiny_data), "max_sentences": 20, "seeds": [0, 1],
                                                 "methods": ["PerExampleDiffMask", "Occlusion"], "figures": False,
                                                 "score_empty_optimum": False})
    config["method_options"]["PerExampleDiffMask"]["steps"] = 30
    config["quick"] = False
    results = sst_erasure.run(config, tmp_path, verbose=False)
    record = results["methods"]["PerExampleDiffMask"]
    assert [row["seed"] for row in record["per_seed"]] == [0, 1]
    for key in ("precision", "recall", "f1", "optimality", "l0", "sufficiency"):
        values = [row[key] for row in record["per_seed"]]
        assert record[key] == pytest.approx(sum(values) / 2)  # the table's score: the mean over seeds
        assert record["std_over_seeds"][key] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)
    # different seeds, different masks (30 noisy steps on 20 sentences)
    assert record["per_seed"][0] != record["per_seed"][1]
    assert "per_seed" not in results["methods"]["Occlusion"]  # deterministic methods run once
    assert any("run once per seed" in note for note in results["notes"])
    text = sst_erasure.write_report({**results, "config": config}, tmp_path / "report.md")
    assert "## Per-example masks, seed by seed" in text and "| `PerExampleDiffMask` | 1 |" in text
