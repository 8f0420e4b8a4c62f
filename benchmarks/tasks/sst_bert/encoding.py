"""SST sentences as word-piece batches (:class:`EncodedSST`): ids, mask, labels and the
word each token belongs to, in length buckets that cut padding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from benchmarks.tasks.sst import batch_order, SSTSentence, unescape_ptb


@dataclass
class EncodedSST:
    r"""
    SST sentences as word-piece tensors for a BERT-family classifier.

    Rows are right-padded: the real tokens of a row (``[CLS]``, the word pieces,
    ``[SEP]``) are a prefix of it.

    Attributes:
        input_ids (Tensor): (N, T) long word-piece ids, the pad id at padding.
        attention_mask (Tensor): (N, T) long, 1 at real tokens, 0 at padding.
        labels (Tensor): (N,) long sentence labels, 0..4.
        word_index (Tensor): (N, T) long, the index of the SST word each token
                    belongs to (into ``sentences[i].words``), -1 at ``[CLS]``,
                    ``[SEP]`` and padding.
        sentences (list of SSTSentence): the sentences, in row order.
    """

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    word_index: Tensor
    sentences: List[SSTSentence] = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        r"""(N,) long number of real tokens per row (``[CLS]`` and ``[SEP]`` included)."""
        return self.attention_mask.sum(1)

    @property
    def num_words(self) -> Tensor:
        r"""(N,) long number of words per row that have tokens (all of the
        sentence's words unless truncation cut some off)."""
        return self.word_index.max(1).values.clamp(min=-1) + 1

    def subset(self, index: Union[Tensor, Sequence[int]]) -> "EncodedSST":
        r"""
        The rows ``index``, trimmed to their longest row.

        Args:

            index (Tensor or sequence of int): long row indices or an (N,) bool mask.

        Returns:
            *EncodedSST* with ``len(index)`` rows (or the mask's True count).
        """
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = torch.nonzero(index).flatten()
        index = index.long().flatten()
        longest = max(int(self.lengths[index].max()), 1) if len(index) else 1
        return EncodedSST(
            self.input_ids[index, :longest], self.attention_mask[index, :longest], self.labels[index],
            self.word_index[index, :longest], [self.sentences[i] for i in index.tolist()],
        )

    def order(self, shuffle: bool = False, seed: int = 0, sort_by_length: bool = False, batch_size: int = 1) -> List[Tensor]:
        r"""
        The row indices of each batch :meth:`batches` yields, in order.

        Args:

            shuffle, seed, sort_by_length, batch_size: as in :meth:`batches`.

        Returns:
            *list* of (B,) long tensors; together they hold every row exactly once.
        """
        return batch_order(self.lengths, batch_size, shuffle, seed, sort_by_length)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        with_labels: bool = False,
        sort_by_length: bool = False,
    ) -> Iterator[Tuple[Tensor, ...]]:
        r"""
        Batches ``(input_ids, attention_mask)`` (plus ``labels`` when
        ``with_labels``), each trimmed to its longest row: the form the library's
        methods take (``inputs``, then ``additional_forward_args=(mask,)``), and
        the model's positional arguments (``model(input_ids, attention_mask)``).

        Args:

            batch_size (int): rows per batch (the last may be smaller).
            shuffle (bool, optional): a random order (of rows, or of length
                        buckets with ``sort_by_length``). Default: False
            seed (int, optional): the order's seed. Default: 0
            with_labels (bool, optional): add the (B,) labels last. Default: False
            sort_by_length (bool, optional): batches of rows of similar length
                        (length buckets) to cut padding; with ``shuffle`` the
                        rows within a length and the buckets come in a random
                        order. Default: False

        Returns:
            *iterator* of tuples ``(ids (B, T_b), mask (B, T_b)[, labels (B,)])``
            with ``T_b`` the longest row of the batch.
        """
        for index in self.order(shuffle, seed, sort_by_length, batch_size):
            longest = max(int(self.lengths[index].max()), 1)
            batch: Tuple[Tensor, ...] = (self.input_ids[index, :longest], self.attention_mask[index, :longest])
            yield batch + ((self.labels[index],) if with_labels else ())

    def loader(
        self,
        batch_size: int,
        shuffle: bool = True,
        seed: Optional[int] = 0,
        with_labels: bool = False,
        sort_by_length: bool = False,
    ) -> "EncodedBatches":
        r"""
        A re-iterable view of :meth:`batches`: each pass is a new order (when
        ``shuffle``), reproducible from ``seed``, as ``DiffMask.fit`` and
        ``fit_statistics`` take it.

        Args:

            batch_size, with_labels, sort_by_length: as in :meth:`batches`.
            shuffle (bool, optional): a new random order every pass. Default: True
            seed (int, optional): the orders' seed, with the pass counted from
                        the loader's first; None: each pass's order drawn from
                        torch's global RNG, as a ``DataLoader`` with ``shuffle``
                        draws it, so that a fit resumed from its state (which
                        restores that RNG) draws the orders of an uninterrupted
                        one. Default: 0

        Returns:
            *EncodedBatches* with ``len()`` = the number of batches per pass.
        """
        return EncodedBatches(self, batch_size, shuffle, seed, with_labels, sort_by_length)


class EncodedBatches:
    r"""Re-iterable batches of an :class:`EncodedSST` (see :meth:`EncodedSST.loader`)."""

    def __init__(self, data: EncodedSST, batch_size: int, shuffle: bool, seed: Optional[int], with_labels: bool,
                 sort_by_length: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.data, self.batch_size, self.shuffle, self.seed = data, batch_size, shuffle, seed
        self.with_labels, self.sort_by_length = with_labels, sort_by_length
        self.epoch = 0

    def __iter__(self) -> Iterator[Tuple[Tensor, ...]]:
        # a new order every pass (epoch), reproducible from the seed, or from
        # torch's RNG (drawn here, not when the first batch is asked for)
        self.epoch += 1
        seed = int(torch.randint(2**62, ())) if self.seed is None else self.seed * 100_003 + self.epoch
        return self.data.batches(self.batch_size, self.shuffle, seed, self.with_labels, self.sort_by_length)

    def __len__(self) -> int:
        return -(-len(self.data) // self.batch_size)


def encode_sst(sentences: Sequence[SSTSentence], tokenizer: Any, max_length: int = 128) -> EncodedSST:
    r"""
    Sentences as word-piece tensors, with the word each token belongs to.

    Each SST word is unescaped (:func:`~benchmarks.tasks.sst.unescape_ptb`:
    ``-LRB-`` -> ``(``, ``\/`` -> ``/``, ...) and the words are tokenised as
    pre-split words (``is_split_into_words=True``), so a token never straddles
    two SST words and ``word_index`` maps every piece back to its word. A word
    the tokenizer turns into no pieces at all (only characters its normaliser
    drops) is replaced by ``[UNK]``, so that every word keeps at least one token
    (none in SST with MiniLM's tokenizer). Rows longer than ``max_length`` tokens
    are truncated (``[SEP]`` kept); the words cut off then have no tokens (SST's
    longest sentence is 66 MiniLM tokens).

    Args:

        sentences (sequence of SSTSentence): at least one.
        tokenizer: a BERT-family fast tokenizer (:func:`load_minilm`,
                    :func:`tiny_bert`).
        max_length (int, optional): the most tokens per row. Default: 128

    Returns:
        *EncodedSST*, padded to its longest row.
    """
    if len(sentences) == 0:
        raise ValueError("sentences must not be empty")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
        raise ValueError(f"max_length must be an int >= 3, got {max_length!r}")
    words = [[unescape_ptb(w) for w in s.words] for s in sentences]
    # Words that come out as no pieces at all (only characters the normaliser
    # drops) become [UNK]; BERT pre-tokenises each pre-split word on its own, so
    # a word's pieces alone are its pieces in the sentence.
    unique = list(dict.fromkeys(w for row in words for w in row))
    pieces = tokenizer(unique, add_special_tokens=False)["input_ids"] if unique else []
    empty = {w for w, p in zip(unique, pieces) if not p}
    if empty:
        words = [[tokenizer.unk_token if w in empty else w for w in row] for row in words]
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
    rows_ids: List[List[int]] = list(encoded["input_ids"])
    rows_words: List[List[Optional[int]]] = [encoded.word_ids(i) for i in range(len(words))]
    longest = max(len(r) for r in rows_ids)
    n = len(sentences)
    input_ids = torch.full((n, longest), int(tokenizer.pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros(n, longest, dtype=torch.long)
    word_index = torch.full((n, longest), -1, dtype=torch.long)
    for i, (ids, row_words) in enumerate(zip(rows_ids, rows_words)):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        word_index[i, : len(ids)] = torch.tensor([-1 if w is None else w for w in row_words], dtype=torch.long)
    labels = torch.tensor([s.label for s in sentences], dtype=torch.long)
    return EncodedSST(input_ids, attention_mask, labels, word_index, list(sentences))
