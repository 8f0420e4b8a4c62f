"""The known-answer study: its checks read the depths' keep probabilities by the
prompts' parts, and a capped smoke run on a small encoder fills the report."""

import argparse
import json
import random
from types import SimpleNamespace

import pytest
import torch

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
    # the digits of the prompts whose output needs none: dropped at the top depth, or the check is missed
    none = known_answer.NONE
    dropped = known_answer.checks([{**_depth(0, 1.0, 1.0), none: 1.0}, {**_depth(1, 0.95, 0.1), none: 0.05}], {"0": "needed"})
    kept = known_answer.checks([{**_depth(0, 1.0, 1.0), none: 1.0}, {**_depth(1, 0.95, 0.1), none: 0.6}], {"0": "needed"})
    assert [c["met"] for c in dropped] == [True] * 5 and [c["met"] for c in kept] == [True, True, True, False, True]
    # no held-out prompt needs the digits: their checks are missed, not met by default
    nothing = known_answer.checks([{"depth": 0, none: 1.0}, {"depth": 1, none: 0.1}], {"0": "converged"})
    assert [(c["value"], c["met"]) for c in nothing[1:]] == [("no such input", False), ("no such input", False), (0.1, True)]


class _Counter(torch.nn.Module):
    # answers 1 when the embeddings' first coordinate sums above 0, else 0
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(3, 2)
        self.embed.weight.data = torch.tensor([[0.0, 0.0], [-1.0, 0.0], [3.0, 0.0]])

    def get_input_embeddings(self):
        return self.embed

    def forward(self, inputs_embeds, attention_mask):
        total = inputs_embeds[..., 0].sum(1)
        logits = torch.stack([torch.zeros_like(total), total], -1)[:, None, :]
        return SimpleNamespace(logits=logits)


def test_a_prompt_needs_its_digits_when_erasing_them_flips_its_answer():
    ids = torch.tensor([[0, 2, 1, 1], [0, 1, 1, 1], [0, 2, 2, 1]])  # token 0 the query, 1 and 2 digits
    truth = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]])
    data = SimpleNamespace(ids=ids, mask=torch.ones_like(ids), digits=ids > 0, truth=truth)
    # token 0 the query, 1 and 2 digits;
    # the mean digit is (3 + 3 + 3 - 6 x 1) / 9 = 1/3: erasing prompt 0's 2 takes its sum from 1 to -5/3 (flips);
    # prompt 1 has no ground truth (nothing to erase); prompt 2's erased 1 takes 5 to 5 + 4/3 (no flip)
    assert known_answer.needs_digits(_Counter(), data).tolist() == [True, False, False]


def test_the_known_masks_cost_is_the_kl_of_replacing_what_the_output_does_not_need():
    ids = torch.tensor([[0, 2, 1, 1], [0, 1, 1, 1], [0, 2, 2, 1]])
    others = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 1, 1, 0]]).bool()
    rows = torch.tensor([True, False, True])
    cost = known_answer.mask_cost(_Counter(), ids, torch.ones_like(ids), others, torch.tensor([0.5, 0.0]), rows,
                                  known_answer.last_position)
    # prompt 0's sum goes from 1 to 3 + 0.5 + 0.5 = 4 (answer kept), prompt 2's from 5 to 0.5 + 0.5 - 1 = 0 (a tie:
    # the answer becomes 0); by -1, prompt 0 is as it was and prompt 2 sums to -3
    def kl(before, after):
        p, q = (torch.tensor([0.0, v]).log_softmax(-1) for v in (before, after))
        return float((p.exp() * (p - q)).sum())

    assert cost["inputs"] == 2 and cost["flipped"] == 0.5
    assert cost["kl"] == pytest.approx((kl(1.0, 4.0) + kl(5.0, 0.0)) / 2, rel=1e-6)
    rows_of = known_answer.known_mask_costs(_Counter(), ids, torch.ones_like(ids), torch.tensor([0.5, 0.0]),
                                            torch.tensor([-1.0, 0.0]), "digit", known_answer.last_position,
                                            [("the other digits", others, rows, "prompts needing them")])
    assert [(r["by"], r["kl"]) for r in rows_of] == [
        ("the fit's learned baseline (top depth)", pytest.approx(cost["kl"])),
        ("the mean digit", pytest.approx((kl(1.0, 1.0) + kl(5.0, -3.0)) / 2, rel=1e-6))]


def test_a_sentence_needs_the_trigger_alone_when_erasure_says_so():
    class Adder(torch.nn.Module):
        # predicts class 1 when the real tokens' embeddings sum above 5, else 0
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(4, 1)  # [CLS] or padding 0, word a 0, word b 3, the trigger 3
            self.embed.weight.data = torch.tensor([[0.0], [0.0], [3.0], [3.0]])

        def get_input_embeddings(self):
            return self.embed

        def forward(self, inputs_embeds, attention_mask):
            total = (inputs_embeds[..., 0] * attention_mask).sum(1)
            return SimpleNamespace(logits=torch.stack([torch.full_like(total, 5.0), total], -1))

    ids = torch.tensor([[0, 2, 3, 0], [0, 2, 2, 3], [0, 1, 1, 3], [0, 2, 3, 1]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    word_index = torch.tensor([[-1, 0, 1, -1], [-1, 0, 1, 2], [-1, 0, 1, 2], [-1, 0, 1, 2]])
    held = SimpleNamespace(input_ids=ids, attention_mask=mask, word_index=word_index)
    # the other words' tokens: b, b b, a a, b a: mean 12 / 7. Sentence 0 (b + T = 6, class 1): erased 3 + 12/7 < 5
    # leaves it, but alone 12/7 + 3 < 5 does not keep it; 1 (9): erased 6 + 12/7 stays; 2 (3): not in class 1;
    # 3 (6): erased 3 + 12/7 + 0 < 5 leaves it, alone 2 x 12/7 + 3 > 5 keeps it
    assert known_answer.needs_trigger(Adder(), held, ids == 3, label=1, batch_size=3).tolist() == [False, False, False, True]


def test_a_capped_smoke_run_fills_every_depth_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    monkeypatch.setattr(known_answer, "QUICK", {"data": {"num_examples": 600}, "model": {"epochs": 1}})
    part = known_answer.toy_encoder(seed=0, quick=True, max_steps=3)
    layers = part["model"]["layers"]
    assert [d["depth"] for d in part["depths"]] == list(range(layers + 1)) and part["fit"]["steps"] == 3
    parts = [k for k in part["depths"][0] if k != "depth"]  # those some held-out prompt has
    assert parts and all(0.0 <= d[k] <= 1.0 for d in part["depths"] for k in parts)
    assert 0 <= part["model"]["prompts_needing_digits"] <= part["model"]["prompts"]
    assert (known_answer.NONE in parts) == (part["model"]["prompts_needing_digits"] < part["model"]["prompts"])
    # settle, keep, drop; the digits of the prompts needing none where some do; depth 0 against the top where
    # some prompt needs its digits
    both = "digits (ground truth)" in parts and "digits (others)" in parts
    assert len(part["checks"]) == 3 + (known_answer.NONE in parts) + both
    text = known_answer.markdown({"toy-encoder": part}, "the command")
    assert "Command: `the command`" in text and "| check | value | target | met |" in text
    assert "## The toy task on a BERT-style encoder" in text and "A trigger planted" not in text
    met = sum(c["met"] for c in part["checks"])
    assert f"**the toy encoder, {met} of {len(part['checks'])} checks met**" in text
    assert "Not run here: the part trigger (`--parts`)." in text
    assert part["fit"]["l0"] == "mean" and "defaults (`l0='mean'`)" in text  # the constructor's default, stated
    assert [(r["replaced"], r["on"]) for r in part["known_mask"]] == [
        ("the other digits", "prompts needing their digits")] * 2 + [("every digit", "prompts needing none")] * 2
    assert all(r["kl"] is None or r["kl"] >= -1e-6 for r in part["known_mask"])
    assert "| the other digits | the fit's learned baseline (top depth) | prompts needing their digits |" in text
    # the objective's own answer without a probe: a row of the same parts
    assert set(part["objective"]["keep"]) == set(parts) and all(0.0 <= v <= 1.0 for v in part["objective"]["keep"].values())
    assert f"| per example, no probe ({part['objective']['steps']} steps) | - |" in text
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
    assert 0 <= part["model"]["sentences_needing_trigger"] <= part["model"]["sentences"] == 4
    parts = [k for k in part["depths"][0] if k != "depth"]  # none when no held-out sentence needs the trigger
    assert (parts == ["the trigger", "the other words"]) == (part["model"]["sentences_needing_trigger"] > 0)
    assert all(0.0 <= d[k] <= 1.0 for d in part["depths"] for k in parts)
    assert part["checks"][1]["check"] == "the top depth keeps the trigger"
    text = known_answer.markdown({"trigger": part}, "the command")
    assert "## A trigger planted in the SST MiniLM" in text and "`cf` planted" in text
    assert [r["by"] for r in part["known_mask"]] == ["the fit's learned baseline (top depth)", "the mean other word"]
    assert all(r["inputs"] == part["model"]["sentences_needing_trigger"] for r in part["known_mask"])


def test_the_l0_choice_says_whether_the_runs_trigger_is_one_it_saw():
    assert known_answer.chosen_on("cf", 4, 3) == known_answer.CHOSEN_ON
    unseen = known_answer.chosen_on("tq", 0, 5)
    assert unseen["L0"]["on"] == "development" and "no unseen test" not in unseen["L0"]["why"]
    assert "this trigger ('tq' -> 0, seed 5) was not seen before the switch" in unseen["L0"]["why"]
    assert unseen["L0"]["why"].startswith("the constructor's default") and unseen["seed"]["why"].startswith("5, ")
    assert unseen["thresholds"] == known_answer.CHOSEN_ON["thresholds"]
    assert known_answer.chosen_on("cf", 4, 5)["L0"] != known_answer.CHOSEN_ON["L0"]  # another seed: unseen


def test_options_reach_the_fit_and_the_constructor_and_the_report_names_them(tmp_path, monkeypatch):
    from benchmarks.tasks.sst import SSTSentence

    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    made = []

    class Recorded(known_answer.DiffMask):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(known_answer, "DiffMask", Recorded)
    words = ["good", "bad", "film", "plot", "dull", "fine"]
    generator = random.Random(1)
    sentences = [SSTSentence(tuple(generator.choice(words) for _ in range(5)), generator.randrange(5), (2,) * 5)
                 for _ in range(40)]
    options = {"fit": {"lr": 1e-4, "eps": 0.5, "optimization": {"lr_baseline": 0.0}}, "probe": {"init_bias": 2.0}}
    part = known_answer.trigger_model(sentences[:32], sentences[32:], trigger="cf", label=4, share=0.5, seed=0,
                                      max_steps=2, model={"source": "tiny", "epochs": 1, "lr": 1e-3, "batch_size": 8},
                                      options=options)
    (dm,) = made
    assert dm.init_bias == 2.0 and dm.fit_record["steps"] == part["fit"]["steps"] == 2
    assert part["fit"]["eps"] == 0.5  # the bound the report's known-mask rows are read against
    assert dm.fit_record["options"]["lr"] == 1e-4 and dm.fit_record["options"]["optimization"]["lr_baseline"] == 0.0
    text = known_answer.markdown({"trigger": part, "options": options,
                                  "chosen_on": known_answer.chosen_on("cf", 4, 3, options)}, "the command")
    said = "lr=0.0001, eps=0.5, optimization={'lr_baseline': 0.0}, DiffMask(init_bias=2.0)"
    assert f"Fit's defaults but {said} where the answer is known: **" in text
    assert f"at every depth with its and fit's defaults but {said} (`l0='mean'`)" in text
    assert f"| fit | `rule` | DiffMask's and fit's defaults but {said}, the study's arguments (--fit, --probe)" in text
    assert known_answer.chosen_on("cf", 4, 3, {"fit": {}, "probe": {}}) == known_answer.CHOSEN_ON
    args = argparse.Namespace(trigger="cf", label=4, share=0.5, seed=3, fit_sentences=None)
    plain = known_answer.trigger_checkpoint(args)  # the defaults' fit keeps its state's name
    assert known_answer.trigger_checkpoint(argparse.Namespace(**vars(args), options={"fit": {}, "probe": {}})) == plain
    assert known_answer.trigger_checkpoint(argparse.Namespace(**vars(args), options=options)) != plain


def test_the_options_must_be_json_objects(tmp_path, capsys):
    with pytest.raises(SystemExit):
        known_answer.main(["--markdown", str(tmp_path / "r.md"), "--probe", "[1]"])
    assert "--probe: a JSON object of options, got [1]" in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()
