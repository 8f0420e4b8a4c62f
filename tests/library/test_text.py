"""Text in, words out: explain() tokenises raw text, runs any method, and merges
word pieces into words by the rule that fits the scores (max for keep
probabilities, sum for additive attributions)."""

import json

import pytest
import torch
import transformers as hf

from captum_diffmask import DiffMask, explain, merge_into_words
from captum_diffmask.methods import IntegratedGradients

from tiny_models import tiny_wordpiece

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
WORDS = ["a", "film", "with", "lovely", "perform", "##ances", "dull", "and", "slow"]
TEXTS = ["a film with lovely performances", "dull and slow"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_wordpiece(WORDS)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=37, num_labels=3, max_position_embeddings=32)
    return hf.BertForSequenceClassification(config).eval()


def test_pieces_merge_by_max_for_probabilities_and_by_sum_for_attributions():
    scores = torch.tensor([[0.9], [0.2], [0.7], [0.1], [0.0]])
    word_ids = [None, 0, 1, 1, None]  # [CLS] word0 word1=two pieces [SEP]
    assert merge_into_words(scores, word_ids, "max").flatten().tolist() == pytest.approx([0.2, 0.7])
    assert merge_into_words(scores, word_ids, "sum").flatten().tolist() == pytest.approx([0.2, 0.8])
    with pytest.raises(ValueError, match="rule must be one of"):
        merge_into_words(scores, word_ids, "mean")
    with pytest.raises(ValueError, match="word_ids has 2 entries, the scores 5 tokens"):
        merge_into_words(scores, word_ids[:2], "sum")


def test_integrated_gradients_on_text_sums_a_words_pieces(model, tokenizer):
    ig = IntegratedGradients(model)
    result = explain(ig, TEXTS, tokenizer, layer=0, n_steps=8)
    assert result.rule == "sum" and result.columns == ["score"]
    assert result.tokens[0] == ["[CLS]", "a", "film", "with", "lovely", "perform", "##ances", "[SEP]"]
    assert result.words[0] == ["a", "film", "with", "lovely", "performances"]
    assert result.words[1] == ["dull", "and", "slow"] and len(result.tokens[1]) == 5  # padding dropped
    pieces = result.token_scores[0][5:7, 0].sum()
    assert float(result.word_scores[0][4, 0]) == pytest.approx(float(pieces), abs=1e-6)
    # the same numbers as attribute on the tokenised batch
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    direct = ig.attribute(batch["input_ids"], additional_forward_args=(batch["attention_mask"],
                                                                         batch["token_type_ids"]), n_steps=8)
    assert torch.allclose(result.token_scores[0][:, 0], direct[0, :8].float(), atol=1e-6)


def test_diffmask_on_text_keeps_a_column_per_depth_and_takes_the_largest_piece(model, tokenizer):
    batch = tokenizer(TEXTS * 4, padding=True, return_tensors="pt")
    dm = DiffMask(model, mode="input")
    dm.fit([batch] * 2, max_steps=3, seed=0, verbose=False, convergence={"until_converged": False})
    result = explain(dm, TEXTS, tokenizer, layer=None)
    assert result.rule == "max" and result.columns == ["layer 0", "layer 1", "layer 2"]
    word, pieces = result.word_scores[0][4], result.token_scores[0][5:7]
    assert torch.equal(word, pieces.max(0).values)
    assert ((result.word_scores[1] >= 0) & (result.word_scores[1] <= 1)).all()
    # each column carries its layer's verdict, in every view
    assert result.verdicts == [dm.convergence[k]["status"] for k in range(3)]
    assert all(v in ("converged", "needed", "unsettled", "violated", "open", "closed", "collapsed")
               for v in result.verdicts)
    assert result.to_dict()["verdicts"] == result.verdicts
    assert "layer 2: " in str(result) and f"[{result.verdicts[2]}]" in str(result)
    page = result.to_html()
    assert page.count("data-verdict=") == 2 * 3 and "class='legend'" in page
    one = explain(dm, TEXTS, tokenizer, layer=1)
    assert one.verdicts == [dm.convergence[1]["status"]]


def test_the_views_show_every_word_and_round_trip_as_json(model, tokenizer):
    result = explain(IntegratedGradients(model), "a film with lovely performances", tokenizer, n_steps=4)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["examples"][0]["words"] == ["a", "film", "with", "lovely", "performances"]
    assert len(data["examples"][0]["word_scores"]) == 5
    text = str(result)
    assert "performances(" in text and "IntegratedGradients" in text
    page = result.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.count("class='w'") == 5
    # no fit of its own: its check of its completeness gap in the verdict's place
    assert result.verdicts[0].startswith("checked: completeness gap") and "data-verdict='checked: " in page
    assert "attribution over the row's largest magnitude" in page and "keep probability" not in page


def test_small_and_large_attributions_print_in_a_stated_power_of_ten():
    from captum_diffmask.interface.explanation import Explanation, print_unit

    assert print_unit([torch.tensor([[3e-5], [-1.2e-5]])]) == pytest.approx(1e-5)
    assert print_unit([torch.tensor([[2.6e5], [float("nan")]])]) == pytest.approx(1e5)
    assert print_unit([torch.tensor([[0.5], [-0.02]])]) == 1.0 and print_unit([torch.zeros(2, 1)]) == 1.0
    tiny = Explanation("IntegratedGradients", ["a b"], ["score"], "sum", words=[["a", "b"]],
                       word_scores=[torch.tensor([[3.2e-5], [-1.1e-5]])])
    text = str(tiny)
    assert "scores in units of 1e-05" in text and "a(3.20) b(-1.10)" in text  # not a(0.00) b(-0.00)
    kept = Explanation("DiffMask", ["a b"], ["layer 0"], "max", words=[["a", "b"]],
                       word_scores=[torch.tensor([[0.01], [0.0]])])
    assert "units" not in str(kept) and "a(0.01) b(0.00)" in str(kept)  # probabilities: on their own 0..1 scale


def test_to_captum_gives_records_that_captums_visualize_text_renders(model, tokenizer):
    from captum.attr import visualization

    result = explain(IntegratedGradients(model), TEXTS, tokenizer, n_steps=4)
    logits = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]])
    records = result.to_captum(predictions=logits, labels=["pos", "neg"])
    assert [r.raw_input_ids for r in records] == result.words and records[0].pred_class == 1
    assert records[0].pred_prob == pytest.approx(float(logits[0].softmax(-1)[1]))
    assert records[1].attr_class == 0 and records[1].true_class == "neg"
    for record, scores in zip(records, result.word_scores):
        assert float(record.word_attributions.abs().max()) == pytest.approx(1.0)  # Captum's colours take -1..1
        assert record.attr_score == pytest.approx(float(scores[:, 0].sum()))
    page = visualization.visualize_text(records).data
    assert page.count("<mark") == sum(len(w) for w in result.words) and "performances" in page and "pos" in page
    assert result.to_captum()[0].pred_class == "-"
    with pytest.raises(ValueError, match=r"column must be in 0..0"):
        result.to_captum(column=1)
    with pytest.raises(ValueError, match=r"predictions must be \(B, C\) logits for the 2 texts"):
        result.to_captum(predictions=logits[:1])


def test_an_all_dropped_diffmask_row_is_drawn_empty_not_scaled_up():
    from captum_diffmask.interface.explanation import Explanation

    result = Explanation("DiffMask", ["a b"], ["layer 0"], "max", words=[["a", "b"]],
                         word_scores=[torch.tensor([[0.01], [0.0]])])
    assert "rgba(0,160,0,0.010)" in result.to_html()  # 0.01 on the 0..1 scale, not 1.0


def test_clear_errors_for_texts_and_tokenizers(model, tokenizer):
    ig = IntegratedGradients(model)
    with pytest.raises(ValueError, match="texts must be a string, a non-empty sequence of strings or a pathlib.Path"):
        explain(ig, [], tokenizer)
    with pytest.raises(ValueError, match="texts must be a string"):
        explain(ig, [1, 2], tokenizer)

    with pytest.raises(ValueError, match=r"^texts is empty or only whitespace"):
        explain(ig, "", tokenizer)
    with pytest.raises(ValueError, match=r"^texts\[1\] is empty or only whitespace \(2 texts are\)"):
        explain(ig, ["a film", "  \t", ""], tokenizer)

    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="tokenizer must be a Hugging Face fast tokenizer.*got Slow"):
        explain(ig, "a film", Slow())


def test_texts_come_as_a_string_a_list_or_a_file_and_batch_for_fit_and_compare(model, tokenizer, tmp_path):
    from captum_diffmask import compare
    from captum_diffmask.model.texts import read_texts, text_batches

    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(TEXTS) + "\n\n")
    records = tmp_path / "texts.jsonl"
    records.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    assert read_texts(lines) == read_texts(records) == TEXTS
    batches = text_batches(lines, tokenizer, batch_size=1)
    assert len(batches) == 2 and batches[1]["input_ids"].shape == (1, 5)
    dm = DiffMask(model, mode="hidden")
    dm.fit(records, tokenizer=tokenizer, max_steps=2, seed=0, verbose=False, convergence={"until_converged": False})
    assert dm.is_fitted
    from_text = compare(model, TEXTS, ["Occlusion"], tokenizer=tokenizer)
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert torch.equal(from_text.scores["Occlusion"], compare(model, encoded, ["Occlusion"]).scores["Occlusion"])
    with pytest.raises(ValueError, match="texts need tokenizer="):
        compare(model, TEXTS, ["Occlusion"])
    records.write_text('{"sentence": "a film"}\n')
    with pytest.raises(ValueError, match="line 1: needs a string field 'text'"):
        read_texts(records)


def test_a_comparison_of_texts_has_words_merged_by_each_methods_rule(model, tokenizer):
    from captum_diffmask import compare

    class KeepProbability:
        scores_are_probabilities = True
        uses_target = False

        def attribute(self, inputs, additional_forward_args=None, layer=0):
            return torch.linspace(0, 1, inputs.shape[1]).expand(inputs.shape) * additional_forward_args[0]

    result = compare(model, TEXTS, [KeepProbability(), "Occlusion"], tokenizer=tokenizer)
    assert result.words == [["a", "film", "with", "lovely", "performances"], ["dull", "and", "slow"]]
    pieces = result.scores["KeepProbability"][0, 5:7]  # perform ##ances
    assert float(result.word_scores("KeepProbability")[4]) == pytest.approx(float(pieces.max()))
    assert float(result.word_scores("Occlusion")[4]) == pytest.approx(float(result.scores["Occlusion"][0, 5:7].sum()))
    assert len(result.to_dict()["word_scores"]["Occlusion"][1]) == 3
    page = result.to_html(examples=[0]).split("class='legend'", 1)[1]  # the examples' rows
    assert ">performances</span>" in page and "##ances" not in page and page.count("class='w'") == 2 * 5
    assert "##ances" in result.to_html(examples=[0], words=False)
    ids_only = compare(model, tokenizer(TEXTS, padding=True, return_tensors="pt")["input_ids"], ["Occlusion"])
    with pytest.raises(ValueError, match="this comparison has no words"):
        ids_only.word_scores("Occlusion")


def _byte_level_bpe():
    r"""A GPT-2-style byte-level BPE tokenizer (``Ġ`` marks a leading space),
    built in memory: merges for " the" and "cat"."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("c", "a"), ("ca", "t")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return hf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


def test_decoded_words_split_at_whitespace_for_byte_level_bpe():
    from captum_diffmask.model.texts import decoded_words

    bpe = _byte_level_bpe()
    ids = bpe("cats the cat, sat\nok<|endoftext|>the")["input_ids"]
    # cat s | Ġthe | Ġ (space only) | cat , | Ġ | s a t | Ċ (newline) | o k | eos | t h e
    assert bpe.convert_ids_to_tokens(ids)[:4] == ["cat", "s", "Ġthe", "Ġ"]
    word_ids, words = decoded_words(bpe, ids)
    assert word_ids == [0, 0, 1, None, 2, 2, None, 3, 3, 3, None, 4, 4, None, 5, 5, 5]
    assert words == ["cats", "the", "cat,", "sat", "ok", "the"]


def test_decoded_words_follow_wordpiece_continuations_and_keep_unknown_words(tokenizer):
    from captum_diffmask.model.texts import decoded_words

    ids = tokenizer("a film with lovely performances zzz")["input_ids"]  # zzz is [UNK]
    word_ids, words = decoded_words(tokenizer, ids)
    assert words == ["a", "film", "with", "lovely", "performances", "[UNK]"]
    assert word_ids == [None, 0, 1, 2, 3, 4, 4, 5, None]


def test_batches_by_length_hold_every_text_once_with_less_padding_the_median_first(tokenizer):
    from captum_diffmask.model.texts import text_batches

    texts = [" ".join(["film"] * (1 + (7 * i) % 13)) for i in range(52)]  # 4 of each of 1 to 13 words, mixed
    plain, by_length = text_batches(texts, tokenizer, batch_size=4), text_batches(texts, tokenizer, 4, by_length=True)

    def rows(batches):
        return sorted(tuple(ids[m.bool()].tolist()) for b in batches for ids, m in zip(b["input_ids"], b["attention_mask"]))

    assert rows(by_length) == rows(plain) and len(by_length) == len(plain) == 13
    real = sum(int(b["attention_mask"].sum()) for b in plain)
    padded = [sum(b["input_ids"].numel() for b in batches) for batches in (plain, by_length)]
    assert padded[1] == real < padded[0]  # 4 texts of each length: no padding at all
    # the median batch first; the others shuffled (not ascending), the same on every call
    widths = [b["input_ids"].shape[1] for b in by_length]
    assert widths[0] == sorted(widths)[len(widths) // 2] and widths[1:] != sorted(widths[1:])
    assert widths == [b["input_ids"].shape[1] for b in text_batches(texts, tokenizer, 4, by_length=True)]
