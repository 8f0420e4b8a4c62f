"""The toy task as text for a decoder (benchmarks.tasks.toy_lm) and the toy-lm
suite, small."""

import json

import torch

from benchmarks.runner import run_suite
import pytest

from benchmarks.tasks.toy_lm import answer_logits, ARROW, COLON, DIGIT0, encode_toy, NO, token_text, toy_decoder, YES
from captum_diffmask.evaluation.toy_task import ToyData


def test_a_prompt_is_query_colon_digits_arrow_left_padded_with_the_truth_on_the_digits():
    data = ToyData(ids=torch.tensor([[1, 2, 1, 0], [3, 3, 3, 3]]), query=torch.tensor([[1, 2], [0, 3]]),
                   mask=torch.tensor([[True, True, True, False], [True] * 4]), labels=torch.tensor([1.0, 0.0]))
    text = encode_toy(data, digits=10)
    q = DIGIT0 + 10  # the query's own digit tokens
    assert text.ids[0].tolist() == [0, q + 1, q + 2, COLON, DIGIT0 + 1, DIGIT0 + 2, DIGIT0 + 1, ARROW]
    assert text.mask[0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1]
    assert text.digits[0].tolist() == [False] * 4 + [True] * 3 + [False]
    assert text.truth[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
    assert text.truth[1].tolist() == [0, 0, 0, 1, 1, 1, 1, 0] and text.mask[1].sum() == 8
    assert text.answers.tolist() == [YES, NO]
    assert [token_text(int(t)) for t in text.ids[0, 1:]] == ["<1>", "<2>", ":", "1", "2", "1", "->"]


def test_a_small_run_writes_every_section(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    overrides = {"data": {"num_examples": 1200}, "model": {"epochs": 1}, "eval_examples": 30,
                 "methods": ["DiffMask", "IntegratedGradients", "Occlusion", "Random"],
                 "method_options": {"DiffMask": {"epochs": 1}}, "diffmask_every_layer": {"epochs": 1}}
    results = run_suite("toy-lm", tmp_path / "out", quick=True, overrides=overrides, verbose=False)
    assert [r["layer"] for r in results["diffmask_layers"]] == [0, 1, 2, 3]
    for name in ("DiffMask", "IntegratedGradients", "Occlusion", "Random"):
        record = results["methods"][name]
        assert record["status"] == "ok" and 0 <= record["js"] <= 0.7, (name, record)
    checks = results["models"][0]["ground_truth_check"]
    assert [c["layer"] for c in checks] == [0, 1, 2, 3]
    for check in checks:
        assert set(check) == {"layer", "kl_others", "flip_others", "kl_truth", "flip_truth", "kl_query", "flip_query"}
        assert check["kl_others"] >= 0 and check["kl_truth"] >= 0
        assert 0 <= check["flip_others"] <= 1 and 0 <= check["flip_truth"] <= 1
    # each site is replaced where it is read: the embeddings' replacement is not the first block's
    assert checks[0]["kl_truth"] != checks[1]["kl_truth"]
    assert checks[-1]["kl_truth"] == checks[-1]["kl_others"] == 0  # the last block: only the reading position counts
    speed = results["generation_speed"]
    assert set(speed["methods"]) == {"DiffMask", "IntegratedGradients", "Occlusion"}
    assert all(r["ratio_to_forward_step"] > 0 for r in speed["methods"].values())
    assert [c["target"] for c in results["checks"]][:2] == ["decoder held-out accuracy >= 99 % (every seed)",
                                                             "DiffMask JS <= 0.05 at hidden.1"]
    report = (tmp_path / "out" / "report.md").read_text()
    for heading in ("## Scores", "## The decoders", "## Where each decoder reads the digits", "## DiffMask at every layer", "## Cost per generated token",
                    "## Targets", "JS (nats), GRU"):
        assert heading in report
    assert (tmp_path / "out" / "figures" / "toy_lm_generation.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((tmp_path / "out" / "results.json").read_text())["suite"] == "toy-lm"


def test_seeds_in_worker_processes_give_the_numbers_of_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    overrides = {"data": {"num_examples": 600}, "model": {"epochs": 1}, "eval_examples": 20, "seeds": [0, 1],
                 "methods": ["DiffMask", "Occlusion"], "method_options": {"DiffMask": {"epochs": 1}},
                 "diffmask_every_layer": {"epochs": 1}, "figures": False}
    together = run_suite("toy-lm", tmp_path / "a", quick=True, overrides={**overrides, "workers": 1}, verbose=False)
    apart = run_suite("toy-lm", tmp_path / "b", quick=True, overrides={**overrides, "workers": 2}, verbose=False)
    for name in ("DiffMask", "Occlusion"):
        js = [[r["js"] for r in results["methods"][name]["per_seed"]] for results in (together, apart)]
        assert js[0] == js[1] and len(js[0]) == 2, (name, js)
    assert [m["seed"] for m in apart["models"]] == [0, 1]


def test_the_prompts_parts_cover_every_real_position_once():
    from benchmarks.suites.toy_lm.extras import position_groups

    data = ToyData(ids=torch.tensor([[1, 2, 1, 0], [3, 3, 3, 3]]), query=torch.tensor([[1, 2], [0, 3]]),
                   mask=torch.tensor([[True, True, True, False], [True] * 4]), labels=torch.tensor([1.0, 0.0]))
    text = encode_toy(data, digits=10)
    groups = position_groups(text)
    assert groups["query"][0].tolist() == [False, True, True] + [False] * 5
    assert groups[": and ->"][0].tolist() == [False, False, False, True, False, False, False, True]
    assert groups["digits (others)"][1].tolist() == [False] * 8  # every digit is the query's 3
    covered = sum(g.long() for g in groups.values())
    assert torch.equal(covered, text.mask.long())


def test_the_encoder_reads_every_position_from_every_other_and_the_decoder_does_not():
    ids = torch.tensor([[DIGIT0 + 15, DIGIT0 + 16, COLON, DIGIT0 + 1, DIGIT0 + 2, ARROW]])
    changed = ids.clone()
    changed[0, 4] = DIGIT0 + 7  # a later digit
    mask = torch.ones_like(ids)
    for architecture, later_reaches_earlier in (("encoder", True), ("decoder", False)):
        model = toy_decoder(10, layers=2, hidden=16, heads=2, seed=0, init_std=0.1, architecture=architecture).eval()
        with torch.no_grad():
            first = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[1][0, 3]
            second = model(input_ids=changed, attention_mask=mask, output_hidden_states=True).hidden_states[1][0, 3]
        assert (not torch.allclose(first, second)) == later_reaches_earlier, architecture
        assert answer_logits(model, ids, mask).shape == (1, model.config.vocab_size)
    with pytest.raises(ValueError, match="architecture must be one of"):
        toy_decoder(10, architecture="recurrent")


def test_a_small_encoder_run_reads_the_last_position_and_leaves_generation_out(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    overrides = {"data": {"num_examples": 1200}, "model": {"epochs": 1, "architecture": "encoder"}, "eval_examples": 30,
                 "methods": ["DiffMask", "IntegratedGradients", "Random"],
                 "method_options": {"DiffMask": {"epochs": 1}}, "diffmask_every_layer": {"epochs": 1}}
    results = run_suite("toy-lm", tmp_path / "out", quick=True, overrides=overrides, verbose=False)
    assert all(results["methods"][name]["status"] == "ok" for name in ("DiffMask", "IntegratedGradients", "Random"))
    assert [r["layer"] for r in results["diffmask_layers"]] == [0, 1, 2, 3] and not results["generation_speed"]
    for row in results["diffmask_layers"]:
        assert list(row["keep_by_group"]) == ["query", "digits (ground truth)", "digits (others)", ": and ->"]
        assert all(0.0 <= v <= 1.0 for v in row["keep_by_group"].values())
    assert results["title"].startswith("Toy task on a bidirectional encoder")
    assert results["checks"][0]["target"] == "encoder held-out accuracy >= 99 % (every seed)"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## The encoders" in report and "## Cost per generated token" not in report
    assert not (tmp_path / "out" / "figures" / "toy_lm_generation.html").exists()
    assert (tmp_path / "out" / "figures" / "toy_encoder_attributions.png").is_file()
