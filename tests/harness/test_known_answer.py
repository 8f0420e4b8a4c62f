"""The known-answer study: its checks read the depths' keep probabilities by the
prompts' parts, and a capped smoke run on a small encoder fills the report."""

import json

from benchmarks.studies import known_answer


def _depth(depth, truth, others):
    return {"depth": depth, "query": 1.0, "digits (ground truth)": truth, "digits (others)": others, ": and ->": 1.0}


def test_the_checks_are_the_known_answers():
    found = known_answer.checks([_depth(0, 1.0, 1.0), _depth(1, 0.95, 0.1)], {"0": "needed", "1": "converged"})
    assert [c["met"] for c in found] == [True, True, True, True]
    missed = known_answer.checks([_depth(0, 0.5, 0.5), _depth(1, 0.8, 0.6)], {"0": "needed", "1": "violated"})
    assert [c["met"] for c in missed] == [False, False, False, False]
    assert missed[0]["value"] == "1 of 2" and missed[3]["value"] == "0.500 vs 0.700"


def test_a_capped_smoke_run_fills_every_depth_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    monkeypatch.setattr(known_answer, "QUICK", {"data": {"num_examples": 600}, "model": {"epochs": 1}})
    part = known_answer.toy_encoder(seed=0, quick=True, max_steps=3)
    layers = part["model"]["layers"]
    assert [d["depth"] for d in part["depths"]] == list(range(layers + 1)) and len(part["checks"]) == 4
    assert all(0.0 <= d["digits (others)"] <= 1.0 for d in part["depths"]) and part["fit"]["steps"] == 3
    text = known_answer.markdown({"toy-encoder": part}, "the command")
    assert "Command: `the command`" in text and "| check | value | target | met |" in text
    json.dumps(part)  # the report's JSON holds plain values
