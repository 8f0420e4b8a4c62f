"""The suite's human rationales: SST labels the sentiment of every word, so the
words with a non-neutral label (and, in the strict variant, a strongly
positive or negative one) are the rationale a plausible attribution ranks
first. Tokens are word pieces; a word's pieces share its label."""

from __future__ import annotations

from typing import Dict

import torch
from torch import Tensor

from benchmarks.tasks.sst_bert import EncodedSST

#: variant -> the SST word labels (0 very negative .. 4 very positive) it marks.
VARIANTS = {"non-neutral": (0, 1, 3, 4), "strong": (0, 4)}


def word_tokens(data: EncodedSST) -> Tensor:
    r"""(N, T) bool: the word pieces of SST words (not ``[CLS]``, ``[SEP]`` or
    padding): the tokens the metrics may remove."""
    return data.word_index >= 0


def rationale_masks(data: EncodedSST) -> Dict[str, Tensor]:
    r"""Per variant of :data:`VARIANTS`, the (N, T) bool mask of the word pieces
    whose word's own SST label is in the variant."""
    labels = torch.full(data.word_index.shape, -1, dtype=torch.long)
    for row, sentence in enumerate(data.sentences):
        index = data.word_index[row]
        real = index >= 0
        word_labels = torch.as_tensor(sentence.word_labels, dtype=torch.long)
        labels[row, real] = word_labels[index[real]]
    return {name: torch.isin(labels, torch.as_tensor(marked)) for name, marked in VARIANTS.items()}
