"""The ferret agreement study's own side (ferret's needs an environment of its own,
so the comparison is a benchmark command with a committed report): the token
counts it relies on, and the documented difference of deletion, pinned here by
deleting tokens by hand as ferret does."""

import json

import torch

from benchmarks.studies.peer_agreement import (
    build_model, FRACTIONS, our_side, sentences_of_ten_words, verdict, without_positions,
)
from captum_diffmask.evaluation.faithfulness import eraser_scores, TokenEraser


def _deleted_by_hand(model, tokenizer, text, scores, keep_top, fraction, target):
    r"""ferret's deletion: drop the words (top or not top), re-encode the rest."""
    words = text.split()
    order = sorted(range(len(words)), key=lambda i: -scores[i + 1])  # scores carry [CLS] first
    top = set(order[: int(fraction * len(words))])
    kept = [w for i, w in enumerate(words) if (i in top) == keep_top]
    batch = tokenizer(" ".join(kept), return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits.softmax(-1)[0, target].item()


def test_our_side_counts_as_ferret_does_on_ten_word_sentences():
    model, tokenizer = build_model(0)
    side = our_side(model, tokenizer, sentences_of_ten_words(3, 0))
    assert side["ours"]["counts"] == [int(f * 10) for f in FRACTIONS] == list(range(1, 11))
    assert all(len(row) == len(FRACTIONS) for row in side["ours"]["mask"]["comprehensiveness"])
    # at fraction 1 every word is gone (comprehensiveness) or kept (sufficiency 0)
    assert all(abs(row[-1]) < 1e-6 for row in side["ours"]["mask"]["sufficiency"])


def test_deletion_equals_hiding_from_attention_only_without_position_embeddings():
    model, tokenizer = build_model(0)
    texts = sentences_of_ten_words(4, 1)
    for case, expect_equal in ((model, False), (without_positions(model), True)):
        side = our_side(case, tokenizer, texts)
        batch = tokenizer(texts, return_tensors="pt")
        with torch.no_grad():
            full = case(**batch).logits.softmax(-1)
        differences = []
        for index, (text, scores, target) in enumerate(zip(texts, side["scores"], side["targets"])):
            for position, fraction in enumerate(FRACTIONS[:-1]):
                by_hand = _deleted_by_hand(case, tokenizer, text, scores, False, fraction, target)
                ours = side["ours"]["delete"]["comprehensiveness"][index][position]
                differences.append(abs((full[index, target].item() - by_hand) - ours))
        if expect_equal:
            assert max(differences) < 1e-5
        else:
            assert max(differences) > 1e-2  # positions move: another input


def test_the_verdicts_name_the_documented_difference_and_flag_the_rest():
    row = {"model": "bert", "removal": "delete", "per_fraction": 0.5, "aopc": 0.3}
    assert verdict(row, 1e-5) == "differs, as documented"
    assert verdict({**row, "model": "bert, position embeddings zero"}, 1e-5) == "**disagrees**"
    assert verdict({**row, "removal": "mask", "per_fraction": 1e-7, "aopc": 1e-7}, 1e-5) == "agrees"


def test_the_eraser_with_masks_puts_masks_id_embedding_in_place():
    model, tokenizer = build_model(0)
    batch = tokenizer(sentences_of_ten_words(2, 2), return_tensors="pt")
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    eraser = TokenEraser(model, "baseline", baseline=tokenizer.mask_token_id)
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[:, 3] = False
    masked = ids.clone()
    masked[:, 3] = tokenizer.mask_token_id
    with torch.no_grad():
        by_ids = model(input_ids=masked, attention_mask=mask, token_type_ids=types).logits.softmax(-1)
    ours = eraser.class_probabilities(ids, (mask, types), keep.float())
    assert (ours - by_ids).abs().max() < 1e-6
    result = eraser_scores(eraser, ids, torch.rand(ids.shape), (mask, types), fractions=FRACTIONS)
    assert result["comprehensiveness"].shape == (2, len(FRACTIONS))


def test_the_inseq_side_gets_prompts_that_tokenise_back_with_their_next_token(tmp_path):
    from benchmarks.studies.peer_agreement import build_language_model, inseq_side_inputs

    saved = inseq_side_inputs(tmp_path, seed=0, prompts=2)
    again = tmp_path / "again"
    again.mkdir()
    _, tokenizer = build_language_model(again, seed=0)
    written = json.loads((tmp_path / "inseq.json").read_text())
    for generated, tokens in zip(written["generated"], saved["tokens"]):
        assert tokenizer(generated)["input_ids"] == tokens  # what inseq will tokenise is what ours attributed
    assert {p.name for p in (tmp_path / "gpt2").iterdir()} >= {"config.json"}
    assert all(len(row) == len(tokens) - 1 for row, tokens in zip(saved["ours"]["sum"], saved["tokens"]))
