"""Text in, words out: any method's scores for raw text, with word pieces merged
into the words they spell.

:func:`explain` tokenises the texts with the user's (fast) tokenizer, runs the
method's ``attribute`` (Captum's tensors in, tensors out, unchanged) and returns
an :class:`Explanation` that keeps each example's tokens, its words and both
scores. Word pieces are merged by the tokenizer's word ids, with a rule that
follows what the scores are (:func:`word_rule`):

- **keep probabilities** (DiffMask, the per-example masks, exact erasure: a
  method whose ``scores_are_probabilities``): a word's score is the largest of
  its pieces' (the word is needed when any of its pieces is; a probability is
  not additive);
- **attributions** (Integrated Gradients, occlusion, the bottlenecks: amounts
  that add up over the inputs): a word's score is the sum of its pieces'.

Special tokens (``[CLS]``, ``[SEP]``) and padding belong to no word.
"""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple, Union

import torch
from torch import Tensor

from .attribution import method_trait
from .batches import split_batch
from .html_view import page, table

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


@dataclass
class Explanation:
    r"""
    One method's scores for a list of texts, per token and per word.

    Attributes:

        method (str): the method's class name.
        texts (list of str): the texts explained.
        columns (list of str): what each score column is: ``["score"]``, or
                    ``["layer 0", ..., "layer L"]`` for DiffMask at every depth.
        rule (str): how pieces merged into words (:func:`word_rule`).
        tokens (list of list of str): each text's tokens, special tokens
                    included, padding excluded.
        token_scores (list of Tensor): each text's (T_b, K) token scores.
        words (list of list of str): each text's words, as they appear in it.
        word_scores (list of Tensor): each text's (W_b, K) word scores.
    """

    method: str
    texts: List[str]
    columns: List[str]
    rule: str
    tokens: List[List[str]] = field(default_factory=list)
    token_scores: List[Tensor] = field(default_factory=list)
    words: List[List[str]] = field(default_factory=list)
    word_scores: List[Tensor] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        r"""Plain lists and floats (JSON-ready): the method, the columns, the
        rule and, per text, its tokens, words and both scores."""
        return {
            "method": self.method, "columns": list(self.columns), "rule": self.rule,
            "examples": [
                {"text": text, "tokens": tokens, "token_scores": token_scores.tolist(),
                 "words": words, "word_scores": word_scores.tolist()}
                for text, tokens, token_scores, words, word_scores in zip(
                    self.texts, self.tokens, self.token_scores, self.words, self.word_scores)
            ],
        }

    def show(self, file: Optional[TextIO] = None) -> None:
        r"""Prints each text's words with their scores, a line per column."""
        out = file if file is not None else sys.stdout
        for text, words, scores in zip(self.texts, self.words, self.word_scores):
            print(f"{self.method} ({self.rule} over word pieces): {text}", file=out)
            for k, column in enumerate(self.columns):
                cells = " ".join(f"{word}({float(score[k]):.2f})" for word, score in zip(words, scores))
                print(f"  {column:>9}: {cells}", file=out)

    def __str__(self) -> str:
        buffer = io.StringIO()
        self.show(buffer)
        return buffer.getvalue()

    def to_html(self) -> str:
        r"""
        A self-contained HTML page: per text, one row per column, each word on a
        background whose strength is its score (keep probabilities on their
        absolute 0..1 scale, attributions scaled to the row's largest
        magnitude; green positive, red negative), the score in its tooltip.
        """
        probabilities = self.rule == "max"
        tables = [table(text, [(column, words, scores[:, k].tolist(), probabilities)
                               for k, column in enumerate(self.columns)])
                  for text, words, scores in zip(self.texts, self.words, self.word_scores)]
        return page(self.method, f"({self.rule} over word pieces)", tables)


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
    (:data:`Texts`); ValueError naming ``argument`` otherwise."""
    if isinstance(texts, os.PathLike):
        return read_texts(texts)
    texts = [texts] if isinstance(texts, str) else list(texts) if isinstance(texts, Sequence) else None
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{argument} must be a string, a non-empty sequence of strings or a pathlib.Path "
                         "of a file of texts")
    return texts


def text_batches(texts: Texts, tokenizer: Any, batch_size: int = 16, max_length: Optional[int] = None) -> List[Any]:
    r"""
    Texts tokenised into padded batches, as :meth:`DiffMask.fit` and every
    ``attribute`` take them.

    Args:

        texts: :data:`Texts`.
        tokenizer: a Hugging Face tokenizer.
        batch_size (int, optional): texts per batch. Default: 16
        max_length (int, optional): truncate longer texts. Default: None

    Returns:
        *list* of the tokenizer's ``BatchEncoding`` (tensors).
    """
    texts = as_texts(texts)
    return [tokenizer(texts[i: i + batch_size], padding=True, truncation=max_length is not None,
                      max_length=max_length, return_tensors="pt") for i in range(0, len(texts), batch_size)]


def explain(
    method: Any,
    texts: Union[str, Sequence[str]],
    tokenizer: Any,
    layer: Optional[int] = 0,
    target: Any = None,
    max_length: Optional[int] = None,
    **attribute_options: Any,
) -> Explanation:
    r"""
    Explains raw text with any method of the library (DiffMask included).

    Args:

        method: an object with Captum's ``attribute(inputs, target=...,
                    additional_forward_args=..., layer=...)`` (a fitted
                    :class:`~captum_diffmask.DiffMask`, an
                    :class:`~captum_diffmask.methods.IntegratedGradients`, ...).
        texts: one string, a sequence of strings or a ``pathlib.Path`` of a file
                    of texts (:data:`Texts`).
        tokenizer: a Hugging Face fast tokenizer (its ``word_ids`` and offsets
                    give the words).
        layer (int or None, optional): as the method's ``attribute`` takes it;
                    None with DiffMask scores every depth. Default: 0
        target (optional): as ``attribute`` takes it (None: the predicted class).
                    Default: None
        max_length (int, optional): truncate longer texts to this many tokens.
                    Default: None
        **attribute_options: passed to ``attribute`` (e.g. ``n_steps``).

    Returns:
        *Explanation* with tokens, words and their scores.
    """
    texts = as_texts(texts)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenizer must be a Hugging Face fast tokenizer (PreTrainedTokenizerFast): its word_ids "
                         f"merge word pieces into words; got {type(tokenizer).__name__}")
    encoding = tokenizer(texts, padding=True, truncation=max_length is not None, max_length=max_length,
                         return_offsets_mapping=True, return_tensors="pt")
    batch = {key: value for key, value in encoding.items() if key != "offset_mapping"}
    ids, extra = split_batch(batch, hf_model=True)
    if target is not None:
        attribute_options["target"] = target
    scores = method.attribute(ids, additional_forward_args=extra, layer=layer, **attribute_options)
    scores = (scores[0] if isinstance(scores, tuple) else scores).detach().float().cpu()
    scores = scores.unsqueeze(-1) if scores.dim() == 2 else scores
    columns = ["score"] if scores.shape[-1] == 1 else [f"layer {k}" for k in range(scores.shape[-1])]
    rule = word_rule(method_trait(method, "scores_are_probabilities"))
    result = Explanation(type(method).__name__, texts, columns, rule)
    for b, text in enumerate(texts):
        real = encoding["attention_mask"][b].bool()
        word_ids = [w for w, keep in zip(encoding.word_ids(b), real.tolist()) if keep]
        result.tokens.append(tokenizer.convert_ids_to_tokens(ids[b][real].tolist()))
        result.token_scores.append(scores[b][real])
        result.words.append(_words(text, encoding, b, word_ids))
        result.word_scores.append(merge_into_words(scores[b][real], word_ids, rule))
    return result


def _words(text: str, encoding: Any, b: int, word_ids: Sequence[Optional[int]]) -> List[str]:
    r"""Each word's text, from its first piece's start to its last piece's end."""
    offsets = encoding["offset_mapping"][b].tolist()
    spans: Dict[int, List[int]] = {}
    for t, word in enumerate(word_ids):
        if word is not None:
            start, end = offsets[t]
            span = spans.setdefault(word, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    return [text[spans[w][0]: spans[w][1]] for w in sorted(spans)]
