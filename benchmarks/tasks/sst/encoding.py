"""Sentences as padded id tensors (:class:`SSTData`) and the order of their batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Sequence, Tuple, Union

import torch
from torch import Tensor

from benchmarks.tasks.sst.reading import SSTSentence
from benchmarks.tasks.sst.vocabulary import Vocabulary
from benchmarks.tasks.sst.word_vectors import unescape_ptb


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
