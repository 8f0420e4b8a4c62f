"""Texts as the model reads them and word pieces as the words they spell.

:func:`text_batches` tokenises texts (a string, a list, or a file read by
:func:`read_texts`) into the padded batches every ``attribute`` and
:meth:`DiffMask.fit` take. :func:`merge_into_words` merges per-piece scores into
words by the tokenizer's word ids, with the rule :func:`word_rule` gives: the
largest piece for keep probabilities (a word is needed when any piece is), the
sum for attributions that add up over the inputs. :func:`decoded_words` splits
ids that no text produced (a generation) into words. Special tokens and padding
belong to no word.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor


#: How word-piece scores merge into a word's score.
WORD_RULES = ("max", "sum")


def word_rule(probabilities: bool) -> str:
    r"""``"max"`` for keep probabilities (a method's ``scores_are_probabilities``),
    ``"sum"`` for additive attributions."""
    return "max" if probabilities else "sum"


def merge_into_words(scores: Tensor, word_ids: Sequence[Optional[int]], rule: str) -> Tensor:
    r"""
    Word-piece scores merged into word scores.

    Args:

        scores (Tensor): one example's scores, (T,) or (T, K).
        word_ids (sequence of int or None): the word each of the T tokens belongs
                    to (the tokenizer's ``word_ids()``), None for special tokens
                    and padding.
        rule (str): ``"max"`` or ``"sum"`` (:data:`WORD_RULES`).

    Returns:
        *Tensor* (W,) or (W, K), W the number of words, in their order.
    """
    if rule not in WORD_RULES:
        raise ValueError(f"rule must be one of {WORD_RULES}, got {rule!r}")
    if len(word_ids) != scores.shape[0]:
        raise ValueError(f"word_ids has {len(word_ids)} entries, the scores {scores.shape[0]} tokens")
    words = sorted({w for w in word_ids if w is not None})
    merged = []
    for word in words:
        pieces = scores[[t for t, w in enumerate(word_ids) if w == word]]
        merged.append(pieces.max(0).values if rule == "max" else pieces.sum(0))
    if not merged:
        return scores.new_zeros((0, *scores.shape[1:]))
    return torch.stack(merged)


def encoding_word_ids(encoding: Any) -> Optional[List[List[Optional[int]]]]:
    r"""Each row's word ids from a fast tokenizer's ``BatchEncoding``, or None
    when the batch does not carry them (ids, a dict, a slow tokenizer's)."""
    word_ids = getattr(encoding, "word_ids", None)
    if not callable(word_ids) or not getattr(encoding, "encodings", None):
        return None
    return [list(word_ids(b)) for b in range(len(encoding.encodings))]


def piece_words(tokenizer: Any, tokens: Sequence[str], word_ids: Sequence[Optional[int]]) -> List[str]:
    r"""Each word's text, its pieces joined by the tokenizer
    (``convert_tokens_to_string``: ``perform ##ances`` -> ``performances``)."""
    words = sorted({w for w in word_ids if w is not None})
    return [tokenizer.convert_tokens_to_string([t for t, w in zip(tokens, word_ids) if w == word]).strip()
            for word in words]


def decoded_words(tokenizer: Any, ids: Sequence[int]) -> Tuple[List[Optional[int]], List[str]]:
    r"""
    Words of a sequence of ids by what its pieces decode to, for text that no
    tokenizer call produced (a generation): a piece starts a new word when its
    decoded text starts with whitespace or follows a piece that ended with it
    (GPT-2's ``Ġ``, SentencePiece's ``▁``, a WordPiece without ``##``).
    Punctuation joins the word it touches: words are whitespace-delimited.

    Args:

        tokenizer: a Hugging Face tokenizer (``convert_ids_to_tokens``,
                    ``convert_tokens_to_string``).
        ids (sequence of int): T token ids.

    Returns:
        *tuple* ``(word_ids, words)``: the word of each of the T tokens (None
        for special tokens and pieces that decode to whitespace only), and
        each word's text.
    """
    # an unknown piece is still a word of the text
    special = set(getattr(tokenizer, "all_special_ids", []) or []) - {getattr(tokenizer, "unk_token_id", None)}
    tokens = tokenizer.convert_ids_to_tokens(list(ids))
    word_ids: List[Optional[int]] = []
    words: List[str] = []
    run: List[str] = []  # the pieces since the last special token, decoded together
    decoded, boundary = "", True
    for identifier, token in zip(ids, tokens):
        if identifier in special:
            word_ids.append(None)
            run, decoded, boundary = [], "", True
            continue
        run.append(token)
        text = tokenizer.convert_tokens_to_string(run)
        piece = text[len(os.path.commonprefix([decoded, text])):]
        decoded = text
        if not piece.strip():
            word_ids.append(None)
            boundary = True
            continue
        if boundary or piece[0].isspace():
            words.append("")
        words[-1] += piece
        word_ids.append(len(words) - 1)
        boundary = piece[-1].isspace()
    return word_ids, [word.strip() for word in words]


#: Texts as the library takes them: one string, a sequence of strings, or a
#: file (a ``pathlib.Path``) of one text per line or JSON lines with ``"text"``.
Texts = Union[str, Sequence[str], "os.PathLike[str]"]


def read_texts(path: Union[str, "os.PathLike[str]"]) -> List[str]:
    r"""
    The texts of a file: one per line, or JSON lines with a ``"text"`` field (a
    ``.jsonl`` or ``.json`` name); blank lines skipped.

    Raises:
        ValueError: naming the file (and line): missing, no text, a line that is
                    not JSON or has no string ``"text"``.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    with open(path, encoding="utf-8") as handle:
        lines = [(n, line.strip()) for n, line in enumerate(handle, 1) if line.strip()]
    texts = [_json_text(path, n, line) if path.endswith((".jsonl", ".json")) else line for n, line in lines]
    if not texts:
        raise ValueError(f"{path}: holds no text")
    return texts


def _json_text(path: str, number: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f"{path}, line {number}: needs a string field 'text'")
    return record["text"]


def as_texts(texts: Texts, argument: str = "texts") -> List[str]:
    r"""A list of strings from one string, a sequence of strings or a file
    (:data:`Texts`); ValueError naming ``argument`` otherwise, and for a text
    that is empty or only whitespace."""
    if isinstance(texts, os.PathLike):
        return read_texts(texts)
    texts = [texts] if isinstance(texts, str) else list(texts) if isinstance(texts, Sequence) else None
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{argument} must be a string, a non-empty sequence of strings or a pathlib.Path "
                         "of a file of texts")
    blank = [i for i, text in enumerate(texts) if not text.strip()]
    if blank:  # a text of no words would come back as a row of no scores
        where = f"{argument}[{blank[0]}]" if len(texts) > 1 else argument
        count = f" ({len(blank)} texts are)" if len(blank) > 1 else ""
        raise ValueError(f"{where} is empty or only whitespace{count}: every text needs at least one word")
    return texts


def text_batches(texts: Texts, tokenizer: Any, batch_size: int = 16, max_length: Optional[int] = None,
                 by_length: bool = False) -> List[Any]:
    r"""
    Texts tokenised into padded batches, as :meth:`DiffMask.fit` and every
    ``attribute`` take them.

    Args:

        texts: :data:`Texts`.
        tokenizer: a Hugging Face tokenizer.
        batch_size (int, optional): texts per batch. Default: 16
        max_length (int, optional): truncate longer texts. Default: None
        by_length (bool, optional): batch texts of about the same number of
                    tokens together, the batches in an order shuffled once
                    with a fixed seed (the same texts give the same batches),
                    the batch of the median length first (a fit's first batch
                    sets the probe's feature scales and starting baselines).
                    Padding is work every pass repeats: SST's train sentences
                    in their file's order, 16 a batch, pad to 1.86 tokens per
                    real token, by length to 1.003. For fitting and scores
                    summed over the batches; the batches no longer follow the
                    texts' order. Default: False

    Returns:
        *list* of the tokenizer's ``BatchEncoding`` (tensors).
    """
    texts = as_texts(texts)
    truncate = {"truncation": max_length is not None, "max_length": max_length}
    groups = [texts[i: i + batch_size] for i in range(0, len(texts), batch_size)]
    if by_length and len(groups) > 1:
        groups = _length_groups(texts, [len(ids) for ids in tokenizer(texts, **truncate)["input_ids"]], batch_size)
    return [tokenizer(group, padding=True, return_tensors="pt", **truncate) for group in groups]


def _length_groups(texts: Sequence[str], lengths: Sequence[int], batch_size: int) -> List[List[str]]:
    r"""``texts`` sorted by ``lengths`` and cut into groups of ``batch_size``, the
    groups shuffled (a fixed seed), the one holding the median length first."""
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    chunks = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    median = chunks[(len(order) // 2) // batch_size]
    random.Random(0).shuffle(chunks)
    chunks.remove(median)
    return [[texts[i] for i in chunk] for chunk in [median] + chunks]
