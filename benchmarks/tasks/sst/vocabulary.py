"""The words of the training sentences as ids (:class:`Vocabulary`)."""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Sequence


from benchmarks.tasks.sst.reading import SSTSentence


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
