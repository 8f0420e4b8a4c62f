"""The sst benchmark suite on a tiny run: a config-built tiny BERT
fine-tuned on a few dozen real SST sentences, two seeds, few steps. It checks the
plumbing, that every section is complete and that the analyses compute what
they say on hand-made inputs."""

import json
import math
import statistics

import pytest
import torch

from benchmarks import runner
from benchmarks.suites import sst as suite
from captum_diffmask.diffmask.constrained.convergence import STATUSES
from benchmarks.tasks.sst import SSTSentence
from tiny_models import needs_sst


TINY = {
    "seeds": [0, 1],
    "stability_seeds": {"seeds": [2], "layers": [0, 2]},
    "train_sentences": 96,
    "eval_sentences": 24,
    "model": {"source": "tiny", "epochs": 2, "batch_size": 16, "lr": 1e-3},
    "diffmask": {"epochs": 1, "batch_size": 16, "validation_sentences": 24,
                 "certificate": {"steps": 5, "closure_examples": 2},
                 "hidden": {"epochs": 2}},  # the mode's own epochs win over the shared ones
    "method_options": {
        "IntegratedGradients": {"n_steps": 4},
        "PerSampleBottleneck": {"steps": 3, "max_batches": 2, "batch_size": 16},
                       "ReadoutBottleneck": {"max_steps": 3, "batch_size": 16},
        "Guan": {"steps": 3},
    },
    "heatmap_sentences": 1,
    "speed": {"sentences": 8, "batch_size": 8, "finetune_batches": 2, "ig_steps": 4, "fit_steps": 3},
    "pos": False,
    "cache": False,
    "workers": 1,
    "paper_recipe": {"epochs": 1, "diffmask": {"batch_size": 16}},
}


# ------------------------------------------------------------- the analyses
def test_stability_is_the_mean_std_across_seeds():
    a = [torch.tensor([[0.0, 1.0], [1.0, 1.0]])]
    b = [torch.tensor([[1.0, 1.0], [1.0, 0.0]])]
    result = suite.stability([a, b])
    std = math.sqrt(0.5)  # two values 0 and 1: sample std
    assert result["mean_std"] == pytest.approx(2 * std / 4)
    assert result["max_std"] == pytest.approx(std)
    assert suite.stability([a]) is None


def test_cls_is_largest_counts_ties_apart():
    assert suite.cls_is_largest(torch.tensor([0.9, 0.1, 0.2])) == (True, False)
    assert suite.cls_is_largest(torch.tensor([0.9, 0.9, 0.2])) == (False, True)
    assert suite.cls_is_largest(torch.tensor([0.1, 0.9, 0.2])) == (False, False)


def test_layers_kept_by_group_by_hand():
    class Data:  # the two fields the function reads
        word_index = torch.tensor([[-1, 0, 1, 1, -1]])
        sentences = [SSTSentence(("good", "filmmaking"), 3, (3, 2))]

    keep = [torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.5, 0.5], [0.0, 0.0], [0.2, 0.0]])]
    groups = suite.layers_kept_by_group(keep, Data(), suite._label_groups)
    assert groups["[CLS]"] == {"mean_layers": 2.0, "tokens": 1}
    assert groups["[SEP]"]["mean_layers"] == pytest.approx(0.2)
    assert groups["positive"] == {"mean_layers": 1.0, "tokens": 1}
    assert groups["neutral"] == {"mean_layers": 0.5, "tokens": 2}  # two word pieces of one word


def test_subset_spreads_over_the_list():
    items = [SSTSentence((str(i),), 0, (0,)) for i in range(10)]
    picked = suite.subset(items, 4)
    assert [s.words[0] for s in picked] == ["0", "3", "6", "9"]
    assert suite.subset(items, None) is items


def test_validation_split_sets_train_sentences_aside():
    train = [SSTSentence((f"t{i}",), 0, (0,)) for i in range(10)]
    dev = [SSTSentence((f"d{i}",), 0, (0,)) for i in range(6)]
    fit_on, valid = suite.validation_split({"validation_sentences": 4}, train, dev)
    assert [s.words[0] for s in valid] == ["t0", "t3", "t6", "t9"]
    assert [s.words[0] for s in fit_on] == ["t1", "t2", "t4", "t5", "t7", "t8"]
    fit_on, valid = suite.validation_split({"validation_sentences": 3, "validation_from": "dev"}, train, dev)
    assert fit_on is train and [s.words[0] for s in valid] == ["d0", "d2", "d5"]
    with pytest.raises(ValueError, match="validation_from"):
        suite.validation_split({"validation_sentences": 3, "validation_from": "test"}, train, dev)
    with pytest.raises(ValueError, match="validation_sentences"):
        suite.validation_split({"validation_sentences": None}, train, dev)


# ----------------------------------------------------------------- a tiny run
@needs_sst
def test_tiny_run_is_complete_and_writes_the_report(tmp_path):
    results = runner.run_suite("sst", tmp_path, overrides=TINY, verbose=False)
    L = results["model"]["layers"]
    assert results["model"]["source"] == "tiny" and 0 <= results["model"]["dev_macro_f1"] <= 100
    for mode in ("input", "hidden"):
        dm = results["diffmask"][mode]
        # seeds 0 and 1 at every layer, the stability seed 2 at layers 0 and 2 alone
        assert [r["seed"] for r in dm["runs"]] == [0, 1, 2] and all(r["selected_epoch"] is None for r in dm["runs"])
        fitted = {0: list(range(L + 1)), 1: list(range(L + 1)), 2: [0, 2]}
        # no checkpoint is selected: the last probe's read-out is scored on the held-out train sentences
        assert all(sorted(r["heldout"]) == [str(k) for k in fitted[r["seed"]]] for r in dm["runs"])
        assert all(sorted(r["convergence"]) == [str(k) for k in fitted[r["seed"]]] for r in dm["runs"])
        layers = dm["faithfulness"]["per_layer"]
        assert [r["layer"] for r in layers] == list(range(L + 1))
        assert [r["seeds"] for r in layers] == [3 if k in (0, 2) else 2 for k in range(L + 1)]
        assert all(0 <= r["masked_share"] <= 100 and 0 <= r["macro_f1"] <= 100 for r in layers)
        # the stability over the three seeds at the stability seed's layers, both ways
        st = dm["stability"]
        assert st["seeds"] == 3 and st["layers"] == [0, 2] and 0 <= st["mean_std"] <= 0.5
        assert len(st["per_layer"]) == 2 and 0 <= st["masked_share_std"] <= 0.5
        shares = {r["seed"]: r["faithfulness"]["per_layer"] for r in dm["runs"]}
        by_hand = [statistics.stdev([row["masked_share"] / 100 for seed in (0, 1, 2) for row in shares[seed]
                                     if row["layer"] == k]) for k in (0, 2)]
        assert st["masked_share_std"] == pytest.approx(statistics.mean(by_hand))
        # the swap test: the three seeds' masks under one objective, at those layers
        assert sorted({p["layer"] for p in dm["swap"]["pairs"]}) == [0, 2] and len(dm["swap"]["pairs"]) == 3 * 2
        assert all(0 <= p["disagreement"] <= 1 and p["masked_gap"] >= 0 for p in dm["swap"]["pairs"])
        # every probe's certificate: 5 further steps, each layer's drift, and whether it counts
        for run in dm["runs"]:
            certificate = run["certificate"]
            assert certificate["tolerances"]["steps"] == 5
            assert certificate["continued"] is False  # no fit cache: no fit state to go on from
            assert run["tol_lambda_needed"] is None  # nor one to read the first verdicts from
            assert sorted(certificate["layers"]) == [str(k) for k in fitted[run["seed"]]]
            assert all(0 <= c["keep_change"] <= 1 and isinstance(c["counted"], bool) for c in certificate["layers"].values())
        assert set(results["layers_kept"][mode]["sentiment"]) >= {"[CLS]", "[SEP]"}
        assert all(0 <= g["mean_layers"] <= L + 1 for g in results["layers_kept"][mode]["sentiment"].values())
    for name in suite.METHODS:
        assert results["methods"][name]["status"] == "ok", results["methods"][name]
        assert name in results["cls_share"]
    assert "DiffMask (hidden)" in results["cls_share"]
    assert results["chosen_on"]["eps"]["on"] == "train" and results["chosen_on"]["model epoch"]["on"] == "rule"
    # fit's own optimisation (no multiplier, lr or votes of the suite's), the mode's own
    # epochs, fit's convergence window with the suite's cool-down, every layer on every batch, and a per-layer
    # convergence report of every fit
    for mode in ("input", "hidden"):
        for run in results["diffmask"][mode]["runs"]:
            assert not {"lr", "multiplier", "votes", "lr_lambda"} & set(run["options"])
            assert run["options"]["epochs"] == (2 if mode == "hidden" else 1) and run["options"]["precision"] == "bfloat16"
            assert len(run["epoch_seconds"]) == run["options"]["epochs"]
            assert run["options"]["convergence"] == {"cooldown": 500}
            assert run["layers_per_batch"] == (L + 1 if run["seed"] < 2 else 2)
            assert all(r["status"] in STATUSES for r in run["convergence"].values())
    # the paper's recipe: its optimisation, the authors' tied input votes, one epoch here
    paper = results["paper_recipe"]
    assert paper["epochs"] == 1 and paper["seeds"] == [0]
    for mode in ("input", "hidden"):
        run = paper["diffmask"][mode]["runs"][0]
        assert run["options"]["optimizer"] == "lookahead-rmsprop" and run["options"]["eps"] == 0.5
        assert run["options"]["layers_per_batch"] == "one" and run["options"]["batch_size"] == 16
        assert (run["options"].get("votes") == "tied") == (mode == "input")
        assert len(run["faithfulness"]["per_layer"]) == L + 1 and sorted(run["heldout"]) == [str(k) for k in range(L + 1)]
    # the train sentences set aside from the fit
    model = results["model"]
    assert model["validation_from"] == "train" and model["validation_sentences"] == 24
    assert model["fit_sentences"] + model["validation_sentences"] == model["train_sentences"] == 96
    speed = results["speed"]
    assert speed["ratio_to_forward"]["forward"] == pytest.approx(1.0)
    assert {"DiffMask input", "DiffMask hidden"} <= set(speed["per_sentence_seconds"])
    assert all(v["epoch_seconds"] > 0 and v["ratio_to_finetune_epoch"] > 0 for v in speed["training"].values())
    # a fit step with the layers' passes stacked and not, per mode, the default first
    assert {mode: list(v) for mode, v in speed["fit_steps"].items()} == {"input": ["same_site", "none"],
                                                                          "hidden": ["none", "all"]}
    assert all(s > 0 for v in speed["fit_steps"].values() for s in v.values())
    # the report, the JSON and every figure it links
    report = (tmp_path / "report.md").read_text()
    for heading in ("Faithfulness", "Stability", "[CLS] share", "Layers a token is kept", "heatmaps", "Speed",
                    "Convergence per layer", "fit's defaults, hidden", "other / default", "The depth profile on the probes that count",
                    "The paper's recipe, as a reference",
                    "verdicts, both modes", "Stability across seeds, both ways", "swap test: masks differ at",
                    "the certificate (`captum_diffmask.certify`)", "certified (count)",
                    "fresh optimiser states in the others"):
        assert heading in report
    # the macro-F1 change's interval and the changed predictions' gap, per layer, mean over the seeds
    assert "F1 change: 95 % interval width" in report and "changed: median top-2 gap" in report
    for mode in ("input", "hidden"):
        for row in results["diffmask"][mode]["faithfulness"]["per_layer"]:
            layer = [r for run in results["diffmask"][mode]["runs"] for r in run["faithfulness"]["per_layer"]
                     if r["layer"] == row["layer"]]
            widths = [r["f1_change_interval"][1] - r["f1_change_interval"][0] for r in layer]
            assert row["f1_change_interval_width"] == pytest.approx(sum(widths) / len(widths)) and min(widths) >= 0
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["suite"] == "sst" and stored["mode"] == "full"
    figures = [results["figures"]["layers_kept"], *results["figures"]["heatmaps"]]
    assert len(results["figures"]["heatmaps"]) == 1
    for figure in figures:
        assert (tmp_path / figure).stat().st_size > 1000 and f"({figure})" in report


def test_bad_configuration_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="methods"):
        suite.run({**suite.DEFAULTS, "methods": ["Nope"]}, tmp_path, verbose=False)
    with pytest.raises(ValueError, match="stability_seeds: seeds"):
        suite.run({**suite.DEFAULTS, "stability_seeds": {"seeds": [1, 2], "layers": [0]}}, tmp_path, verbose=False)
    with pytest.raises(ValueError, match="stability_seeds: layers"):
        suite.run({**suite.DEFAULTS, "stability_seeds": {"seeds": [2], "layers": []}}, tmp_path, verbose=False)
    with pytest.raises(ValueError, match="split"):
        suite.run({**suite.DEFAULTS, "split": "validation"}, tmp_path, verbose=False)


def test_faithfulness_scores_the_gates_of_the_chosen_readout():
    from benchmarks.tasks.sst_bert import EncodedSST

    class Gated:  # stands for DiffMask: the threshold read-out keeps everything, louizos nothing
        mode, num_layers, model, fitted_layers = "hidden", 1, torch.nn.Linear(1, 1), [0, 1]

        def masked_forward(self, ids, args, layer, rule="threshold"):
            original = torch.nn.functional.one_hot(ids[:, 0] % 5, 5).float()
            if rule == "threshold":
                return args[0].float(), original, original  # every real position kept, 0 at padding
            return torch.zeros(ids.shape, dtype=torch.float), original.roll(1, dims=-1), original

    ids = torch.tensor([[0, 1, 2], [1, 2, 0], [2, 0, 0], [3, 4, 0]])
    data = EncodedSST(ids, (ids > 0).long() | torch.tensor([[1, 0, 0]]), ids[:, 0] % 5, torch.zeros_like(ids))
    kept = suite.faithfulness(Gated(), data, 2, False)
    gone = suite.faithfulness(Gated(), data, 2, False, rule="louizos")
    assert [r["masked_share"] for r in kept["per_layer"]] == [0.0, 0.0]
    assert [r["agreement"] for r in kept["per_layer"]] == [100.0, 100.0]
    assert [r["masked_share"] for r in gone["per_layer"]] == [100.0, 100.0]
    assert [r["agreement"] for r in gone["per_layer"]] == [0.0, 0.0]
    assert kept["unmasked"] == gone["unmasked"] and kept["per_layer"][0]["macro_f1"] == kept["unmasked"]["macro_f1"]


def test_convergence_section_checks_the_held_out_read_out_against_eps():
    from benchmarks.common.minilm.convergence import convergence_section

    window = {"kept": 0.5, "kl": 0.01, "lam": 3.0}
    run = {"seed": 0, "options": {"eps": 0.01},
           "history": [{"epoch": 2, "layer": k, "kl": 0.01, "kl_deployed": 0.009} for k in (0, 1)],
           "convergence": {"0": {"status": "converged", "steps": 500, "windows": [window]},
                           "1": {"status": "needed", "steps": 500, "windows": [window]}},
           "heldout": {"0": {"kl": 0.0124}, "1": {"kl": 0.0126}}}
    lines = convergence_section({"input": {"runs": [run]}, "hidden": {"runs": []}})
    text = "\n".join(lines)
    assert "held-out deterministic KL (<= eps x 1.25)" in text
    assert "| input | 0 | 0 | **converged** | 500 | 0.500 | 0.0100 | 0.0100 | 0.0090 | 3.000 | 0.0124 ok |" in text
    assert "0.0126 over" in text and "**needed**" in text


def _run(seed, statuses, heldout, masked, f1):
    per_layer = [{"layer": k, "masked_share": m, "macro_f1": f, "accuracy": 0.0, "agreement": 0.0}
                 for k, (m, f) in enumerate(zip(masked, f1))]
    return {"seed": seed, "options": {"eps": 0.01}, "steps": 500,
            "convergence": {str(k): {"status": v, "steps": 500, "windows": []} for k, v in enumerate(statuses)},
            "heldout": {str(k): {"kl": v} for k, v in enumerate(heldout)},
            "history": [{"epoch": 3, "layer": k, "kl": 0.009, "kl_deployed": 0.011} for k in range(len(statuses))],
            "faithfulness": {"unmasked": {"macro_f1": 50.0}, "per_layer": per_layer}}


def test_a_probe_counts_with_a_verdict_within_the_held_out_bound_and_certified():
    from benchmarks.suites.sst.scoring import counted_layers

    run = _run(0, ["converged", "unsettled", "converged", "needed"], [0.0124, 0.001, 0.0126, 0.0], [0] * 4, [0] * 4)
    state = {layer: {k: v for k, v in c.items() if k != "certified"} for layer, c in counted_layers(run).items()}
    assert state == {0: {"settled": True, "within": True, "counts": True}, 1: {"settled": False, "within": True, "counts": False},
                     2: {"settled": True, "within": False, "counts": False}, 3: {"settled": True, "within": True, "counts": True}}
    assert {c["certified"] for c in counted_layers(run).values()} == {None}  # no certificate measured
    # a selected checkpoint's run scored no held-out read-out: the verdict alone
    assert counted_layers({**run, "heldout": None})[2]["counts"]
    # the certificate: a probe that moved when trained further does not count
    certificate = {"layers": {str(k): {"counted": k != 3} for k in range(4)}}
    certified = counted_layers({**run, "certificate": certificate})
    assert [certified[k]["counts"] for k in range(4)] == [True, False, False, False]
    assert certified[3]["certified"] is False and certified[0]["certified"] is True


def test_the_training_table_gives_no_step_cost_for_a_resumed_fit():
    from benchmarks.suites.sst.report import _step_cost

    run = {"seconds": 64.0, "steps": 20, "options": {"batch_size": 32}}
    assert _step_cost(run, 0.01) == "3.2 s (10.0x)"
    assert _step_cost({**run, "resumed": True}, 0.01) == "n/a (resumed)"


def test_depth_profile_and_verdict_targets_read_the_counted_probes():
    from benchmarks.suites.sst.report import _depth_profile_section, _verdict_targets

    runs = [_run(0, ["converged", "unsettled"], [0.005, 0.005], [20.0, 40.0], [49.5, 47.0]),
            _run(1, ["converged", "converged"], [0.005, 0.02], [30.0, 60.0], [48.0, 45.0])]
    dm = {"input": {"runs": runs}, "hidden": {"runs": runs[:1]}}
    text = "\n".join(_depth_profile_section(dm))
    assert "| 0 | 0, 1 | 20.0, 30.0 | -0.50, -2.00 | 0.0090 / 0.0110, 0.0090 / 0.0110 |" in text
    assert "| 1 | none (seed 0: unsettled; seed 1: converged, held-out KL over) |" in text
    lines = _verdict_targets(dm)
    assert lines[0] == ("- verdicts, input: 3 of 4 probes settled (`converged` or `needed`), 2 of them within "
                        "eps x 1.25 on the held-out train sentences")
    assert lines[-1].startswith("- verdicts, both modes: 4 of 6 probes settled (67 %") and lines[-1].endswith("**missed**")
    # with certificates: the share of probes that count under them (settled, within, and still when trained further)
    certified = [{**run, "certificate": {"layers": {"0": {"counted": True}, "1": {"counted": True}}}} for run in runs]
    lines = _verdict_targets({"input": {"runs": certified}, "hidden": {"runs": certified[:1]}})
    assert lines[-1].startswith("- the certificate (`captum_diffmask.certify`): 3 of 6 probes count") and \
        lines[-1].endswith("**missed**")
    assert "going on from the fit's state in 0 of 3 fits, fresh optimiser states in the others" in lines[-1]
    going_on = [{**run, "certificate": {**run["certificate"], "continued": True}} for run in certified]
    lines = _verdict_targets({"input": {"runs": going_on}, "hidden": {"runs": going_on[:1]}})
    assert "the further steps going on from each fit's state, its optimiser states)" in lines[-1]


@needs_sst
def test_fits_in_worker_processes_give_the_probes_of_one_process(capfd):
    from benchmarks.common.minilm.loading import load_bench
    from benchmarks.suites.sst.orchestration import fit_config, fit_in_workers

    # seed 0 at every layer, the stability seed 1 at layer 1 alone
    config = runner.build_config(suite, overrides={**TINY, "seeds": [0], "workers": 2,
                                                   "stability_seeds": {"seeds": [1], "layers": [1]}})
    bench = load_bench(config, False)
    fitted = fit_in_workers(config, bench, [0, 1], True)
    assert set(fitted) == {("input", 0), ("hidden", 0), ("input", 1), ("hidden", 1)}
    assert "DiffMask fit epoch 1/1, layer 1" in capfd.readouterr().err  # off a terminal, the workers' fits' lines
    ids, mask = bench.evaluated.input_ids[:8], bench.evaluated.attention_mask[:8]
    for mode in ("input", "hidden"):
        for seed, layer in ((0, None), (1, 1)):
            here, info = suite.fit_diffmask(bench.model, mode, bench.train, bench.valid, fit_config(config, seed), seed,
                                            False)
            there, worker_info = fitted[(mode, seed)]
            assert worker_info["steps"] == info["steps"] and set(there.convergence) == set(here.convergence)
            assert sorted(there.fitted_layers) == (list(range(bench.layers + 1)) if layer is None else [layer])
            assert torch.allclose(there.attribute(ids, additional_forward_args=(mask,), layer=layer),
                                  here.attribute(ids, additional_forward_args=(mask,), layer=layer), atol=1e-5)
    assert fit_in_workers({**config, "workers": 1}, bench, [0], False) == {}


@needs_sst
def test_the_papers_recipe_fits_on_the_suites_split_in_workers_too(monkeypatch):
    from benchmarks.common.minilm.loading import load_bench
    from benchmarks.suites.sst import orchestration

    config = runner.build_config(suite, overrides={**TINY, "seeds": [0], "workers": 2})
    bench = load_bench(config, False)
    seen = []

    def fit_in_workers(recipe_config, bench_, seeds, verbose):
        # a worker loads its bench from the configuration it is given
        worker_bench = load_bench(recipe_config, False)
        seen.append((recipe_config["diffmask"], worker_bench))
        return {}

    monkeypatch.setattr(orchestration, "fit_in_workers", fit_in_workers)
    record = orchestration.paper_recipe(config, bench, False)
    (settings, worker_bench), = seen
    assert torch.equal(worker_bench.train.input_ids, bench.train.input_ids)
    assert torch.equal(worker_bench.valid.input_ids, bench.valid.input_ids)
    assert settings["epochs"] == 1 and settings["optimizer"] == "lookahead-rmsprop"
    assert record["diffmask"]["hidden"]["runs"][0]["options"]["eps"] == 0.5


@needs_sst
def test_fits_in_the_cache_are_loaded_not_given_to_workers_unless_their_certificate_is_due(tmp_path, monkeypatch):
    from benchmarks.common.minilm.loading import load_bench
    from benchmarks.suites.sst import orchestration
    from benchmarks.common.minilm.fit_cache import cached_fit, certified_fit
    from benchmarks.common.minilm.fitting import certify_fit

    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    config = runner.build_config(suite, overrides={**TINY, "seeds": [0], "workers": 2, "cache": True})
    bench = load_bench(config, False)
    for mode in ("input", "hidden"):  # stored by an earlier invocation, one stopped before its certificate
        cached_fit(suite.fit_diffmask, bench.model, mode, bench.train, bench.valid, config, 0, False)
    given = []
    monkeypatch.setattr(orchestration, "run_jobs", lambda jobs, *args: given.extend(jobs) or [])
    assert orchestration.fit_in_workers(config, bench, [0], False) == {}  # two certificates due: both in workers
    assert [job.label for job in given] == ["DiffMask input, seed 0", "DiffMask hidden, seed 0"]
    certified_fit(suite.fit_diffmask, certify_fit, bench.model, "input", bench.train, bench.valid, config, 0,
                  False)
    given.clear()
    fitted = orchestration.fit_in_workers(config, bench, [0], False)
    assert [job.label for job in given] == ["DiffMask hidden, seed 0"] and set(fitted) == {("input", 0)}
    certified_fit(suite.fit_diffmask, certify_fit, bench.model, "hidden", bench.train, bench.valid, config, 0,
                  False)
    given.clear()
    fitted = orchestration.fit_in_workers(config, bench, [0], False)
    assert given == [] and set(fitted) == {("input", 0), ("hidden", 0)}
    assert all(info["stored"]["date"] for _, info in fitted.values())
    # the least multiplier tolerance of each first verdict, from the state the cache keeps
    from benchmarks.common.minilm.fit_cache import fit_files

    assert orchestration._first_verdicts(config, bench, "input", 0) is None  # the tiny fit reached no cool-down
    path = fit_files(bench.model, "input", bench.train, bench.valid, config, 0).state
    saved = torch.load(path, weights_only=True)
    saved["state"]["cooling_from"] = saved["state"]["step"]  # as if its cool-down began at its last step
    torch.save(saved, path)
    needed = orchestration._first_verdicts(config, bench, "input", 0)
    assert sorted(needed) == sorted(str(k) for k in saved["monitors"])
    assert all(v is None or v >= 0 for v in needed.values())


def _timed_results(runs, cached_model=True):
    return {"diffmask": {"input": {"runs": runs[:1]}, "hidden": {"runs": runs[1:]}}, "paper_recipe": None,
            "config": {"workers": 2}, "model": {"cached": cached_model, "fine_tune_seconds": 600.0}}


def test_the_run_time_is_judged_only_when_every_fit_ran_in_the_run():
    from benchmarks.suites.sst.report import _whole_run_target

    fresh = [{"seed": 0, "epoch_seconds": [60.0]}, {"seed": 0, "epoch_seconds": [30.0]}]
    assert _whole_run_target(_timed_results(fresh), 4000.0).endswith("**met**")  # 4000 s + 600 s of fine-tuning
    assert _whole_run_target(_timed_results(fresh), 5000.0).endswith("**missed**")
    carried = [{"seed": 0, "epoch_seconds": [1200.0, 1800.0], "stored": {"commit": "abc", "date": "d"}},
               {"seed": 0, "epoch_seconds": [600.0], "resumed": True}]
    line = _whole_run_target(_timed_results(carried), 600.0)
    assert "not judged" in line and "2 of its 2 DiffMask fits" in line and "sum to 60 min" in line
    assert "met" not in line and "missed" not in line


def test_options_line_names_what_differs_by_seed():
    from benchmarks.suites.sst.report import _options_line

    runs = [{"seed": 0, "options": {"eps": 0.01, "max_steps": 2500}},
            {"seed": 1, "options": {"eps": 0.01, "max_steps": 5000}}]
    assert _options_line("hidden", runs) == (
        "Options, hidden: `{'eps': 0.01}`; by seed: `max_steps` 2500 (seed 0), 5000 (seed 1).")
    assert _options_line("input", runs[:1]) == "Options, input: `{'eps': 0.01, 'max_steps': 2500}`."


def test_the_targets_on_the_probes_that_count_leave_out_the_others():
    from benchmarks.suites.sst.report import _counted_target

    def run(seed, statuses, kls, rows):
        return {"seed": seed, "options": {"eps": 0.02},
                "convergence": {str(k): {"status": s} for k, s in enumerate(statuses)},
                "heldout": {str(k): {"kl": v} for k, v in enumerate(kls)},
                "faithfulness": {"per_layer": [{"layer": k, "masked_share": m, "macro_f1": f} for k, (m, f) in enumerate(rows)]}}

    runs = [run(0, ["converged", "violated"], [0.01, 0.01], [(50.0, 44.0), (90.0, 30.0)]),   # layer 1 unsettled
            run(1, ["needed", "converged"], [0.01, 0.03], [(40.0, 45.0), (80.0, 20.0)])]      # layer 1 over the bound
    line = _counted_target("input", runs, 45.0, 45.5)
    assert "the 2 of 4 probes that count: 45.0 % masked, macro-F1 44.50" in line
    assert "lowest: 44.00 at layer 0, seed 0" in line and line.endswith("**met**")
    assert _counted_target("input", runs, 46.0, 45.5).endswith("**missed**")
    none = [run(0, ["violated"], [0.01], [(50.0, 44.0)])]
    assert "none of 1 counts" in _counted_target("hidden", none, 45.0, 45.5)


def test_a_run_from_before_the_stability_seeds_is_over_every_layer():
    from benchmarks.suites.sst.report import stability_of

    runs = [{"faithfulness": {"per_layer": [{"layer": 0, "masked_share": m0}, {"layer": 1, "masked_share": m1}]}}
            for m0, m1 in ((10.0, 40.0), (20.0, 40.0))]
    record = {"stability": {"seeds": 2, "mean_std": 0.1}, "runs": runs,
              "faithfulness": {"per_layer": [{"layer": 0}, {"layer": 1}]}}
    st = stability_of(record)
    assert st["layers"] == [0, 1] and st["masked_share_std"] == pytest.approx((statistics.stdev([0.1, 0.2]) + 0.0) / 2)
    assert stability_of({**record, "stability": None}) is None


def test_the_per_layer_target_counts_the_layers_within_one_point():
    from benchmarks.suites.sst.report import _layers_within_target

    faith = {"unmasked": {"macro_f1": 50.0},
             "per_layer": [{"layer": k, "macro_f1": f} for k, f in enumerate([49.5, 49.0, 48.9, 50.2])]}
    line = _layers_within_target("input", faith)
    assert "within one point of the unmasked model's at 3 of 4 layers (target >= 3; below: 2 (-1.10))" in line
    assert line.endswith("**met**")
    faith["per_layer"][0]["macro_f1"] = 48.0
    assert _layers_within_target("hidden", faith).endswith("**missed**")


def test_the_swap_test_per_layer_splits_the_pairs_whose_objectives_agree():
    from benchmarks.suites.sst.report import _swap_layers_section

    def pair(i, j, layer, disagreement, masked_gap, kl_gap):
        return {"fits": [i, j], "layer": layer, "disagreement": disagreement, "masked_gap": masked_gap, "kl_gap": kl_gap}

    swap = {"layers": [0, 3], "pairs": [pair(0, 1, 0, 0.10, 0.01, 0.002), pair(0, 2, 0, 0.30, 0.05, 0.001),
                                        pair(1, 2, 0, 0.20, 0.01, 0.004), pair(0, 1, 3, 0.05, 0.0, 0.0)]}
    run = {"certificate": {"eps": 0.01, "tolerances": {"masked_share": 0.02, "tol_kl": 0.25}}}
    text = "\n".join(_swap_layers_section({"input": {"runs": [run], "swap": swap}, "hidden": {"runs": [run], "swap": None}}))
    assert "(masked share gap <= 0.02, KL gap <= 0.25 x eps = 0.0025; the certificate's, fixed in advance)" in text
    assert "| input | 0 | 3 | 1 | 0.100 | 0.250 |" in text and "| input | 3 | 1 | 1 | 0.050 | - |" in text
    assert _swap_layers_section({"input": {"runs": [{}], "swap": swap}, "hidden": {"runs": [], "swap": None}}) == []
