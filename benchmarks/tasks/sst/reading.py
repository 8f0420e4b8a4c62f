"""Reading the Stanford Sentiment Treebank: one PTB-tree line as an :class:`SSTSentence`
(the words, the sentence label in 0..4, each word's leaf label), a split read from
the data directory (:func:`resolve_data_dir`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union



#: Where SST comes from (the PTB-tree files are inside the archive's ``trees/``).
SST_URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
#: The split files, without their ``.txt``.
SPLITS = ("train", "dev", "test")
#: The five sentence classes.
LABEL_NAMES = ("very negative", "negative", "neutral", "positive", "very positive")
#: The environment variable naming the data directory.
DATA_ENV = "CAPTUM_DIFFMASK_DATA"




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
    return Path(__file__).resolve().parents[3].parent / "shared" / "data"


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
