"""SST as the word pieces of a BERT-family tokenizer, for the GRU classifier of
:mod:`benchmarks.tasks.sst`.

De Cao et al. (2020, Section 5) ran their GRU over BERT's word-piece embeddings
of ``tokenizer.encode(sentence)``: the tokens it reads, and the tokens erasure
removes, are the word pieces with ``[CLS]`` and ``[SEP]``. Here:

- :func:`piece_tokenizer` and :func:`piece_vectors`: the tokenizer and one
  embedding row per vocabulary id, by name: ``"minilm"`` (all-MiniLM-L6-v2's
  uncased WordPiece tokenizer and its 384-d word-piece table, the vectors before
  position embeddings and LayerNorm; the ``sst`` extra) or ``"random"`` (a small
  WordPiece tokenizer over the training words and random vectors, for tests);
- :func:`encode_pieces`: sentences as :class:`~benchmarks.tasks.sst.SSTData` of
  word-piece ids, each row ``[CLS] pieces [SEP]``, with every piece's text.

The ids are the tokenizer's, so the embedding table covers every word of any
split: no word is unknown.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from benchmarks.tasks.sst import minilm_tables, random_word_vectors, SSTData, SSTSentence
from benchmarks.tasks.sst_bert import encode_sst, tiny_bert

#: The piece sources :func:`piece_tokenizer` and :func:`piece_vectors` know.
PIECE_SOURCES = ("minilm", "random")
# longer than any row: SST's longest sentence is 66 MiniLM tokens
_NO_TRUNCATION = 10_000


def _check_source(name: str) -> None:
    if name not in PIECE_SOURCES:
        raise ValueError(f"embeddings must be one of {PIECE_SOURCES} with unit='piece', got {name!r}")


def piece_tokenizer(name: str, train: Sequence[SSTSentence]) -> Any:
    r"""
    The word-piece tokenizer of a source.

    Args:

        name (str): ``"minilm"`` (MiniLM's uncased WordPiece, offline from the
                    ``sst`` extra) or ``"random"`` (:func:`~benchmarks.tasks.sst_bert.tiny_bert`'s
                    tokenizer over the words of ``train``; other words become
                    ``[UNK]``).
        train (sequence of SSTSentence): the training sentences (``"random"`` only).

    Returns:
        A BERT-family fast tokenizer.
    """
    _check_source(name)
    if name == "minilm":
        return minilm_tables()[0]
    return tiny_bert([w for s in train for w in s.words], spell_unknown=False)[1]


def piece_vectors(name: str, tokenizer: Any, dim: int = 32, seed: int = 0) -> Tensor:
    r"""
    One embedding row per id of ``tokenizer``'s vocabulary.

    Args:

        name (str): ``"minilm"``: MiniLM's word-piece embedding table (the
                    tokenizer must be :func:`piece_tokenizer`'s ``"minilm"``);
                    ``"random"``: :func:`~benchmarks.tasks.sst.random_word_vectors`
                    of each vocabulary entry.
        tokenizer: the tokenizer whose ids index the rows.
        dim (int, optional): H for ``"random"``. Default: 32
        seed (int, optional): seeds ``"random"``. Default: 0

    Returns:
        *Tensor* (V, H) float32, V = the tokenizer's vocabulary size.
    """
    _check_source(name)
    if name == "minilm":
        table = minilm_tables()[1]
        if len(tokenizer) != table.shape[0]:
            raise ValueError(f"tokenizer: {len(tokenizer)} ids, but the MiniLM table has {table.shape[0]} rows")
        return table.clone()
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return random_word_vectors(dim, seed)([token for token, _ in vocabulary])


def encode_pieces(sentences: Sequence[SSTSentence], tokenizer: Any) -> SSTData:
    r"""
    Sentences as word-piece rows ``[CLS] pieces [SEP]`` (the tokens the GRU
    reads, and erasure's unit).

    Words are tokenised as pre-split words, PTB escapes undone
    (:func:`~benchmarks.tasks.sst_bert.encode_sst`), with no truncation.

    Args:

        sentences (sequence of SSTSentence): at least one.
        tokenizer: a BERT-family fast tokenizer (:func:`piece_tokenizer`).

    Returns:
        *SSTData*: ``ids`` (N, T) the tokenizer's ids (0 at padding), ``mask``
        True at every real token ``[CLS]`` and ``[SEP]`` included, ``word_labels``
        each piece's word label (-1 at ``[CLS]``, ``[SEP]`` and padding), and
        ``tokens`` the pieces' text.
    """
    encoded = encode_sst(sentences, tokenizer, max_length=_NO_TRUNCATION)
    mask = encoded.attention_mask.bool()
    ids = encoded.input_ids.masked_fill(~mask, 0)
    word_labels = torch.full_like(ids, -1)
    tokens = []
    for row, sentence in enumerate(sentences):
        index = encoded.word_index[row]
        pieces = index >= 0
        word_labels[row, pieces] = torch.tensor(sentence.word_labels, dtype=torch.long)[index[pieces]]
        tokens.append(tuple(tokenizer.convert_ids_to_tokens(ids[row, mask[row]].tolist())))
    return SSTData(ids, mask, encoded.labels, word_labels, list(sentences), tokens)
