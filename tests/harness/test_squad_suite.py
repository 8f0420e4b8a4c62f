"""The squad benchmark suite: its analyses on hand-made inputs (token groups,
keep per group, the gold answer by correctness, parts of speech, the masked
answers' agreement, the five observations' criteria), the windows it shows,
and a tiny run of the whole suite on a config-built tiny BERT and a
hand-written SQuAD file."""

import json
import types

import pytest
import torch

from benchmarks import runner
from benchmarks.suites.squad import analysis, observations
from benchmarks.suites.squad.fitting import agreement
from benchmarks.suites.squad.side_by_side import composition, crop, select_examples
from benchmarks.tasks.squad import encode_squad, SquadExample
from tiny_models import tiny_wordpiece

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")

WORDS = ["who", "won", "the", "game", "denver", "broncos", "beat", "panthers", "carolina", "by", "a", "score", "of",
         "24", "to", "10", ".", ",", "?", "at", "stadium", "levi", "'", "s", "where", "was", "it", "played", "beaten"]
CONTEXT = "Denver Broncos beat Carolina Panthers by a score of 24 to 10, at Levi's stadium."
QUESTIONS = [("Who won the game?", "Denver Broncos"), ("Where was it played?", "Levi's stadium"),
             ("Who was beaten?", "Carolina Panthers")]
CLS, SEP = 2, 3  # tiny_wordpiece's ids of [CLS] and [SEP]


def _examples():
    return [SquadExample(f"q{i}", "A", CONTEXT, q, (a,), (CONTEXT.index(a),)) for i, (q, a) in enumerate(QUESTIONS)]


@pytest.fixture
def windows():
    return encode_squad(_examples(), tiny_wordpiece(WORDS), max_length=48, doc_stride=16)


# ------------------------------------------------------------- token groups
def test_token_groups_name_segments_specials_and_both_answers(windows):
    tokens = tiny_wordpiece(WORDS).convert_ids_to_tokens(windows.input_ids[0])
    start, end = int(windows.start_positions[0]), int(windows.end_positions[0])  # "denver broncos"
    groups = analysis.token_groups(windows, {0: (0, end + 1, end + 2)}, CLS, SEP)  # predicted: "beat carolina"
    row = groups[0]
    assert len(row) == int(windows.attention_mask[0].sum())
    assert row[0] == {"[CLS]"} and [t for t, g in enumerate(row) if g == {"[SEP]"}] == [6, len(row) - 1]
    assert all(row[t] == {"question"} for t in range(1, 6))  # who won the game ?
    assert row[start] == {"passage", "gold answer"} and row[end] == {"passage", "gold answer"}
    assert row[end + 1] == {"passage", "predicted answer"} and tokens[end + 1] == "beat"
    assert analysis.token_groups(windows, {0: None}, CLS, SEP)[0][end + 1] == {"passage"}


def test_keep_by_group_by_hand():
    keep = [torch.tensor([[1.0, 0.0], [0.6, 0.2], [0.4, 0.4]]), torch.tensor([[0.0, 0.0], [1.0, 1.0]])]
    groups = [[{"[CLS]"}, {"passage", "gold answer"}, {"passage"}], [{"[CLS]"}, {"question"}]]
    result = analysis.keep_by_group(keep, groups)
    assert result["passage"]["keep"] == pytest.approx([50.0, 30.0])
    assert result["passage"]["kept_share"] == pytest.approx([50.0, 0.0])  # 0.6 > 0.5, 0.4 is not
    assert result["passage"]["mean_layers"] == pytest.approx((0.8 + 0.8) / 2) and result["passage"]["tokens"] == 2
    assert result["gold answer"]["keep"] == pytest.approx([60.0, 20.0])
    assert result["[CLS]"]["mean_layers"] == pytest.approx(0.5)
    only_second = analysis.keep_by_group(keep, groups, windows=[1])
    assert set(only_second) == {"[CLS]", "question"} and only_second["[CLS]"]["keep"] == [0.0, 0.0]


def test_gold_when_wrong_splits_windows_by_the_models_correctness():
    keep = [torch.tensor([[0.9], [0.1]]), torch.tensor([[0.2], [0.8]])]
    groups = [[{"passage", "gold answer"}, {"passage"}], [{"passage", "gold answer"}, {"passage"}]]
    owner = torch.tensor([5, 7])
    result = analysis.gold_when_wrong(keep, groups, owner, [5, 7], exact={5: 0.0, 7: 1.0}, f1={5: 0.5, 7: 1.0})
    wrong = result["wrong (EM 0)"]
    assert wrong["questions"] == 1 and wrong["gold answer"]["kept_share"] == [100.0]
    assert wrong["passage"]["kept_share"] == [50.0]
    assert result["right (EM 1)"]["gold answer"]["kept_share"] == [0.0]
    assert result["entirely wrong (F1 0)"] == {"questions": 0}  # no question with F1 0: no tokens


def test_pos_groups_follow_the_character_offsets(windows):
    examples = _examples()
    question = examples[0].question.lstrip()
    q_tags = ["PRON"] * 3 + [""] + ["VERB"] * 3 + [""] + ["DET"] * 3 + [""] + ["NOUN"] * 4 + ["PUNCT"]
    c_tags = ["PROPN" if c != " " else "" for c in CONTEXT]
    assert len(q_tags) == len(question)
    groups = analysis.pos_token_groups(windows.subset([0]), [q_tags], [c_tags])[0]
    assert groups[0] == set() and groups[1] == {"all:PRON", "question:PRON"}
    assert groups[5] == {"all:PUNCT", "question:PUNCT"} and groups[6] == set()  # "?" then [SEP]
    assert groups[7] == {"all:PROPN", "context:PROPN"}


# ----------------------------------------------------------- masked answers
def test_agreement_scores_masked_answers_against_the_models_own():
    examples = _examples()
    bench = types.SimpleNamespace(
        held_out=examples, questions=[0, 1],
        windows=types.SimpleNamespace(attention_mask=torch.ones(2, 10, dtype=torch.long), example_index=torch.tensor([0, 1])))
    masked = {0: {"answers": {0: "Denver Broncos", 1: "Carolina"}, "kept": torch.tensor([10.0, 0.0])}}
    original = {0: "the Denver Broncos", 1: "Levi's stadium"}
    (row,) = agreement(bench, masked, original)
    assert row["masked_share"] == pytest.approx(50.0)  # 10 of 20 positions kept
    assert row["same_exact_match"] == pytest.approx(50.0)  # "the" is dropped by the normalisation
    assert row["gold_exact_match"] == pytest.approx(50.0)
    assert row["over_95_questions"] == 1 and row["over_95_same_exact_match"] == 0.0


# ------------------------------------------------------------- observations
def _keep(question, passage, sep):
    return {"input": {"question": {"mean_layers": question}, "passage": {"mean_layers": passage}},
            "hidden": {"question": {"mean_layers": 1.0}, "passage": {"mean_layers": 1.0}, "[SEP]": {"kept_share": sep}}}


def test_each_observations_criterion_can_hold_and_fail():
    assert observations.question_deeper(_keep(3.0, 2.0, []))["verdict"] == "holds"
    assert observations.question_deeper(_keep(2.0, 3.0, []))["verdict"] == "does not hold"
    assert observations.sep_kept(_keep(0, 0, [95.0, 92.0, 40.0]))["verdict"] == "holds"
    assert observations.sep_kept(_keep(0, 0, [95.0, 92.0, 95.0]))["verdict"] == "partly"
    assert observations.sep_kept(_keep(0, 0, [50.0, 92.0, 95.0]))["verdict"] == "does not hold"
    rows = [{"layer": k, "same_exact_match": 95.0, "masked_share": 90.0 + k, "over_95_questions": k,
             "over_95_same_exact_match": 92.0} for k in range(3)]
    assert observations.prediction_kept({"input": rows})["verdict"] == "holds"
    for r in rows:
        r["over_95_questions"] = 0
    assert observations.prediction_kept({"input": rows})["verdict"] == "partly"  # nothing > 95 % masked
    wrong = {"wrong (EM 0)": {"questions": 4, "gold answer": {"kept_share": [70.0, 50.0]},
                              "passage": {"kept_share": [10.0, 10.0]}}}
    assert observations.gold_when_wrong({"input": wrong})["verdict"] == "holds"
    wrong["wrong (EM 0)"]["gold answer"]["kept_share"] = [20.0, 20.0]
    assert observations.gold_when_wrong({"input": wrong})["verdict"] == "does not hold"


def test_the_pos_order_reads_ranks_among_frequent_tags():
    order = ["CCONJ", "ADP", "DET", "VERB", "NOUN", "ADJ", "PUNCT", "PROPN", "RARE"]
    pos = {"input": {f"all:{g}": {"mean_layers": float(i), "tokens": 100 if g != "RARE" else 3} for i, g in enumerate(order)}}
    result = observations.pos_order(pos)
    assert result["verdict"] == "holds" and "PROPN 8" in result["ours"]  # RARE is not ranked
    pos["input"]["all:ADP"]["mean_layers"] = 7.5  # now among the last
    assert observations.pos_order(pos)["verdict"] == "partly"
    assert observations.pos_order({})["verdict"] == "not measured"


# ------------------------------------------------------------ shown windows
def test_crop_keeps_the_question_and_centres_the_gold_answer(windows):
    bench = types.SimpleNamespace(windows=windows)
    shown = crop(bench, 1, 12)  # "where was it played ?" and 5 passage tokens around "levi ' s stadium"
    n_question = int((windows.token_type_ids[1, : int(windows.attention_mask[1].sum())] == 0).sum())
    assert len(shown) == 12 and shown[:n_question] == list(range(n_question))
    start, end = int(windows.start_positions[1]), int(windows.end_positions[1])
    assert all(t in shown for t in range(start, end + 1)) and shown == sorted(shown)


def test_select_examples_takes_the_shortest_single_window_question_per_passage(windows):
    examples = _examples() + [SquadExample("q3", "B", "Denver won.", "Who won?", ("Denver",), (0,))]
    features = encode_squad(examples, tiny_wordpiece(WORDS), max_length=48, doc_stride=16)
    bench = types.SimpleNamespace(windows=features, held_out=examples)
    # the short passage (9 tokens), then the shortest question on the long one ("who was beaten ?")
    assert select_examples(bench, 5, 48) == [3, 2]
    assert select_examples(bench, 5, 10) == [3]


def test_composition_splits_the_scores_by_group():
    shares = composition(torch.tensor([1.0, 2.0, 3.0, -4.0]), [{"[CLS]"}, {"question"}, {"passage", "predicted answer"},
                                                                {"passage"}])
    assert shares == pytest.approx({"predicted answer": 50.0, "question": 100 / 3, "other passage": 0.0,
                                    "[CLS]/[SEP]": 100 / 6})


# -------------------------------------------------------------- a tiny run
def _squad_file(path):
    contexts = [CONTEXT, "Tesla was born in Smiljan in 1856. He moved to New York in 1884."]
    pairs = [QUESTIONS, [("Where was Tesla born?", "Smiljan"), ("When did he move?", "1884")]]
    articles = [{"title": f"T{t}", "paragraphs": [{"context": contexts[t % 2], "qas": [
        {"id": f"t{t}q{i}", "question": q, "answers": [{"text": a, "answer_start": contexts[t % 2].index(a)}]}
        for i, (q, a) in enumerate(pairs[t % 2])]}]} for t in range(10)]
    path.write_text(json.dumps({"data": articles}))
    return path


def test_tiny_run_is_complete_and_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    tiny = {"data": {"path": str(_squad_file(tmp_path / "squad.json"))}, "train_questions": None,
            "scored_questions": None, "analysis_questions": None,
            "model": {"source": "tiny", "num_layers": None, "max_length": 32, "doc_stride": 8, "epochs": 2,
                      "lr": 1e-2, "batch_size": 8},
            "diffmask": {"validation_windows": 4, "input": {"max_steps": 6}, "hidden": {"max_steps": 6}},
            "method_options": {"IntegratedGradients": {"n_steps": 3}, "PerSampleBottleneck": {"steps": 2, "max_batches": 1},
                               "Guan": {"steps": 2}, "PerExampleDiffMask": {"steps": 2}, "ExactErasure": {"budget": 30}},
            "side_by_side": {"examples": 1, "max_tokens": 32}, "heatmap_examples": 1,
            "speed": {"windows": 2, "batch_size": 2, "ig_steps": 2}, "paper_recipe": {"diffmask": {"max_steps": 4}}}
    results = runner.run_suite("squad", tmp_path / "out", quick=True, overrides=tiny, verbose=False)
    assert results["chosen_on"]["eps"]["on"] == "rule" and all(c["on"] == "rule" for c in results["chosen_on"].values())
    model = results["model"]
    assert model["split"]["held_out_articles"] == 2 and model["split"]["train_articles"] == 8
    assert model["layers"] == 2 and results["questions"]["count"] == model["analysed_questions"]
    for mode in ("input", "hidden"):
        keep = results["keep"][mode]
        assert {"question", "passage", "[CLS]", "[SEP]"} <= set(keep)
        assert all(len(g["keep"]) == 3 and all(0 <= v <= 100 for v in g["keep"]) for g in keep.values())
        assert keep["[CLS]"]["tokens"] == model["analysed_windows"] and keep["[SEP]"]["tokens"] == 2 * model["analysed_windows"]
        assert [r["layer"] for r in results["agreement"][mode]] == [0, 1, 2]
    assert [o["key"] for o in results["observations"]] == list(observations.OBSERVATIONS)
    assert all(o["verdict"] in ("holds", "partly", "does not hold", "not measured") for o in results["observations"])
    erasure = results["side_by_side"]["methods"]["ExactErasure"]
    assert erasure["status"] == "ok" and all(n <= 30 for n in erasure["evaluations"])
    assert all(r["status"] == "ok" for r in results["side_by_side"]["methods"].values())
    report = (tmp_path / "out" / "report.md").read_text()
    paper = results["paper_recipe"]
    assert paper["epochs"] == {"input": 3, "hidden": 1}  # 1 epoch per input depth, one layer drawn per batch
    for mode in ("input", "hidden"):
        record = paper["diffmask"][mode]
        assert record["options"]["optimizer"] == "lookahead-rmsprop" and record["options"]["eps"] == 1.0
        assert record["options"]["epochs"] == paper["epochs"][mode] and record["options"]["layers_per_batch"] == "one"
        assert [r["layer"] for r in record["agreement"]] == [0, 1, 2] and set(record["heldout"]) == {"0", "1", "2"}
    assert paper["diffmask"]["input"]["options"]["votes"] == "tied"
    for heading in ("## The paper's observations on MiniLM", "## Which tokens are kept, per layer",
                    "## The paper's recipe, as a reference",
                    "## The model under DiffMask's gates", "## The methods side by side", "## Speed"):
        assert heading in report
    for path in [results["figures"]["keep"], *results["figures"]["heatmaps"], *results["figures"]["side_by_side"]]:
        assert (tmp_path / "out" / path).is_file()


# ------------------------------------------------------------------ report
def test_the_fit_caveat_counts_converged_and_violated_layers():
    from benchmarks.suites.squad.report import _fit_caveat

    def record(statuses, feasible):
        # every layer on each batch, one frozen early: 10 batches, not 10 + 6 + 10
        return {"convergence": {str(i): {"status": s, "steps": n} for i, (s, n) in enumerate(zip(statuses, (10, 6, 10)))},
                "layers_per_batch": 3, "feasible": feasible, "options": {"eps_valid": 3.0}}

    text = _fit_caveat({"diffmask": {"input": record(["converged", "violated", "violated"], True),
                                     "hidden": record(["converged"] * 3, False)}})[0]
    assert "input: 1 of 3 layers converged, 2 still above the KL bound on the training batches after 10 steps (batches), " \
           "validation within" in text
    assert "hidden: 3 of 3 layers converged after 10 steps (batches), validation outside" in text


def test_squad_convergence_reports_each_chunk_of_every_layer(tmp_path, monkeypatch):
    from benchmarks.studies import squad_convergence

    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    tiny = {"train_questions": None, "scored_questions": None, "analysis_questions": None,
            "model": {"source": "tiny", "num_layers": None, "max_length": 32, "doc_stride": 8, "epochs": 1,
                      "lr": 1e-2, "batch_size": 8},
            "diffmask": {"validation_windows": 4, "batch_size": 2}}
    out = tmp_path / "convergence.json"
    assert squad_convergence.main(["--chunk", "3", "--epochs", "2", "--modes", "input", "--out", str(out),
                                   "--data", str(_squad_file(tmp_path / "squad.json")), "--set", json.dumps(tiny)]) == 0
    result = json.loads(out.read_text())["input"]
    assert [(h["epoch"], h["layer"]) for h in result["history"]] == [(e, k) for e in (1, 2) for k in range(3)]
    assert all(h["steps"] == 3 for h in result["history"])  # every layer on each of the chunk's batches
    assert {k: r["steps"] for k, r in result["convergence"].items()} == {"0": 6, "1": 6, "2": 6}


def test_the_fit_caveat_counts_probes_by_verdict_and_held_out_kl():
    from benchmarks.suites.squad.report import _fit_caveat

    # one layer drawn per batch: the batches are the layers' steps summed
    record = {"convergence": {"0": {"status": "converged", "steps": 20}, "1": {"status": "needed", "steps": 10},
                              "2": {"status": "unsettled", "steps": 20}}, "layers_per_batch": 1,
              "heldout": {"0": {"kl": 1.2}, "1": {"kl": 1.3}, "2": {"kl": 0.1}},
              "feasible": False, "options": {"eps": 1.0}}
    text = _fit_caveat({"diffmask": {"input": record, "hidden": record}})[0]
    # layer 0: settled and 1.2 <= 1.25; layer 1: settled but 1.3 over; layer 2: not settled
    assert "input: 1 of 3 layers converged after 50 steps (batches); 1 of 3 probes count" in text
    assert "eps_valid" not in text


def test_run_device_is_the_cpu_by_default_and_names_a_missing_gpu(monkeypatch):
    from benchmarks.suites.squad.loading import run_device

    assert run_device({}) == torch.device("cpu") and run_device({"device": "cpu"}) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device: 'cuda'"):
        run_device({"device": "cuda"})


def test_held_out_pos_tags_are_read_from_the_cache_once_stored(tmp_path, monkeypatch):
    from benchmarks.suites.squad import orchestration

    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    examples = [SquadExample(id="a", title="T", question=" Who?", context="Ann ran.", answers=("Ann",), answer_starts=(0,))]
    calls = []

    def tagger(texts):
        calls.append(list(texts))
        return [["X"] * len(t) for t in texts]

    monkeypatch.setattr(orchestration, "character_pos_tags", tagger)
    first = orchestration.held_out_pos_tags(examples)
    assert first == {"Ann ran.": ["X"] * 8, "Who?": ["X"] * 4} and len(calls) == 1

    def missing(texts):
        raise ImportError("no spaCy here")

    monkeypatch.setattr(orchestration, "character_pos_tags", missing)
    assert orchestration.held_out_pos_tags(examples) == first  # a machine without spaCy reads the stored tags
    with pytest.raises(ImportError):
        orchestration.held_out_pos_tags(examples, use_cache=False)


def test_environment_names_the_device():
    from benchmarks.records import environment

    assert environment()["device"] == "cpu" and environment("cpu")["device"] == "cpu"


def test_an_observation_is_a_conclusion_only_where_every_probe_of_its_mode_counts():
    from benchmarks.suites.squad.report import _rests_on

    def record(kls):
        return {"convergence": {str(i): {"status": "converged"} for i in range(len(kls))},
                "heldout": {str(i): {"kl": kl} for i, kl in enumerate(kls)}, "options": {"eps": 1.0}}

    results = {"diffmask": {"input": record([0.5, 1.3]), "hidden": record([0.5, 1.2])}}
    assert _rests_on(results, "input") == "input: 1 of 2 count, **not a conclusion**"  # 1.3 > 1.25
    assert _rests_on(results, "hidden") == "hidden: 2 of 2 count"
    assert _rests_on({"diffmask": {"input": {"convergence": {}, "options": {}}}}, "input") == \
        "input: not scored on held-out windows"


def _timed_results(device, input_fit):
    stages = {"model, answers and windows": {"wall": 60.0, "cpu": 100.0}, "DiffMask input: fit": {"wall": 600.0, "cpu": 1000.0}}
    return {"mode": "full", "config": {"device": device}, "stages": stages, "load_average": {},
            "model": {"cached": True, "fine_tune_seconds": 0.0},
            "diffmask": {"input": input_fit, "hidden": {}}, "environment": {"threads": 2}}


def test_the_90_minute_target_is_assessed_only_on_a_cpu_run_that_fitted_its_probes():
    from benchmarks.suites.squad.report import _time_section

    assessed = "\n".join(_time_section(_timed_results(None, {})))
    assert "11.0 min wall" in assessed and "**met**" in assessed
    on_gpu = "\n".join(_time_section(_timed_results("cuda", {})))
    assert "**not assessed** here: it ran on `cuda`" in on_gpu and "met" not in on_gpu
    cached = "\n".join(_time_section(_timed_results(None, {"stored": {"commit": "abc", "date": "2026-11-28"}})))
    assert "its fits ran in earlier invocations" in cached
    resumed = "\n".join(_time_section(_timed_results(None, {"resumed": True})))
    assert "its fits ran in earlier invocations" in resumed


def test_the_training_rate_is_left_out_for_a_fit_not_run_whole_in_this_run():
    from benchmarks.suites.squad.report import _speed_section

    speed = {"windows": 4, "mean_tokens": 100.0, "batch_size": 4, "per_window_seconds": {}, "ratio_to_forward": {},
             "ig_over_diffmask": {},
             "training": {"finetune_windows": 10, "finetune_epoch_seconds": 2.0,
                          "input": {"seconds_per_window": 0.01, "epoch_seconds": 0.1, "ratio_to_finetune_epoch": 0.05},
                          "hidden": {"seconds_per_window": 0.02, "epoch_seconds": 0.2, "ratio_to_finetune_epoch": 0.1}}}
    results = {"speed": speed, "diffmask": {"input": {"resumed": True}, "hidden": {}}}
    lines = "\n".join(_speed_section(results))
    assert "| input | n/a | n/a | n/a: not fitted whole in this run (this run, resumed from a stopped fit's state) |" in lines
    assert "| hidden | 20 ms | 200 ms | 0.10x |" in lines


def test_the_header_says_which_fits_ran_in_earlier_invocations():
    from benchmarks.suites.squad.report import _provenance

    assert _provenance({"diffmask": {"input": {}, "hidden": {}}}) == "Every number below comes from this run."
    text = _provenance({"diffmask": {"input": {"stored": {"commit": "x"}}, "hidden": {"resumed": True}}})
    assert "the DiffMask input and hidden fits ran (wholly or in part) in earlier invocations" in text
    assert "the DiffMask hidden fit ran" in _provenance({"diffmask": {"input": {}, "hidden": {"resumed": True}}})
