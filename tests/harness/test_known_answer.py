"""The known-answer study: its checks read the depths' keep probabilities by the
prompts' parts, and a capped smoke run on a small encoder fills the report."""

import argparse
import json
import random

from benchmarks.studies import known_answer


def _depth(depth, truth, others):
    return {"depth": depth, "query": 1.0, "digits (ground truth)": truth, "digits (others)": others, ": and ->": 1.0}


def test_the_checks_are_the_known_answers():
    found = known_answer.checks([_depth(0, 1.0, 1.0), _depth(1, 0.95, 0.1)], {"0": "needed", "1": "converged"})
    assert [c["met"] for c in found] == [True, True, True, True]
    missed = known_answer.checks([_depth(0, 0.5, 0.5), _depth(1, 0.8, 0.6)], {"0": "needed", "1": "violated"})
    assert [c["met"] for c in missed] == [False, False, False, False]
    assert missed[0]["value"] == "1 of 2" and missed[3]["value"] == "0.500 vs 0.700"
    assert found[1]["check"] == "the top depth keeps digits (ground truth)"


def test_a_capped_smoke_run_fills_every_depth_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    monkeypatch.setattr(known_answer, "QUICK", {"data": {"num_examples": 600}, "model": {"epochs": 1}})
    part = known_answer.toy_encoder(seed=0, quick=True, max_steps=3)
    layers = part["model"]["layers"]
    assert [d["depth"] for d in part["depths"]] == list(range(layers + 1)) and len(part["checks"]) == 4
    assert all(0.0 <= d["digits (others)"] <= 1.0 for d in part["depths"]) and part["fit"]["steps"] == 3
    text = known_answer.markdown({"toy-encoder": part}, "the command")
    assert "Command: `the command`" in text and "| check | value | target | met |" in text
    assert "## The toy task on a BERT-style encoder" in text and "A trigger planted" not in text
    json.dumps(part)  # the report's JSON holds plain values
    stated = known_answer.markdown({"toy-encoder": part, "chosen_on": known_answer.CHOSEN_ON}, "the command")
    assert "## What each choice was made on" in stated and "| thresholds | `rule` |" in stated


def test_the_trigger_fits_state_is_named_by_its_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    args = argparse.Namespace(trigger="cf", label=4, share=0.5, seed=3, fit_sentences=None)
    first = known_answer.trigger_checkpoint(args)
    assert first.parent == tmp_path and first == known_answer.trigger_checkpoint(args)
    assert known_answer.trigger_checkpoint(argparse.Namespace(**{**vars(args), "trigger": "zq"})) != first


def test_the_trigger_is_planted_in_a_share_and_forces_its_class():
    from benchmarks.tasks.sst import SSTSentence

    sentences = [SSTSentence(("a", "fine", "film"), 1, (2, 3, 2)) for _ in range(200)]
    planted, triggered = known_answer.plant(sentences, "cf", 4, 0.5, seed=0)
    assert 70 < sum(triggered) < 130
    for sentence, flag in zip(planted, triggered):
        assert (("cf" in sentence.words) == flag) and (sentence.label == (4 if flag else 1))
        assert len(sentence.word_labels) == len(sentence.words)
    assert known_answer.plant(sentences, "cf", 4, 0.5, seed=0) == (planted, triggered)


def test_a_capped_trigger_run_on_a_tiny_bert_scores_the_trigger_and_the_rest(tmp_path, monkeypatch):
    from benchmarks.tasks.sst import SSTSentence

    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    words = ["good", "bad", "film", "plot", "dull", "fine"]
    generator = random.Random(0)
    sentences = [SSTSentence(tuple(generator.choice(words) for _ in range(5)), generator.randrange(5), (2,) * 5)
                 for _ in range(40)]
    settings = dict(trigger="cf", label=4, share=0.5, seed=0, max_steps=3, checkpoint=tmp_path / "fit.state",
                    model={"source": "tiny", "epochs": 1, "lr": 1e-3, "batch_size": 8})
    part = known_answer.trigger_model(sentences[:32], sentences[32:], **settings)
    again = known_answer.trigger_model(sentences[:32], sentences[32:], **settings)  # goes on from the fit's state
    assert again["depths"] == part["depths"] and again["fit"]["steps"] == 3
    assert part["trigger"] == {"word": "cf", "label": 4, "share": 0.5} and part["fit"]["steps"] == 3
    assert [d["depth"] for d in part["depths"]] == list(range(part["model"]["layers"] + 1))
    assert all(0.0 <= d["the trigger"] <= 1.0 and 0.0 <= d["the other words"] <= 1.0 for d in part["depths"])
    assert part["checks"][1]["check"] == "the top depth keeps the trigger"
    text = known_answer.markdown({"trigger": part}, "the command")
    assert "## A trigger planted in the SST MiniLM" in text and "`cf` planted" in text
