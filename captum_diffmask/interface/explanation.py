"""Text in, words out: any method's scores for raw text, with word pieces merged
into the words they spell.

:func:`explain` tokenises the texts with the user's (fast) tokenizer, runs the
method's ``attribute`` (Captum's tensors in, tensors out, unchanged) and returns
an :class:`Explanation` that keeps each example's tokens, its words and both
scores. Word pieces are merged by the tokenizer's word ids
(:mod:`captum_diffmask.model.texts`), with a rule that follows what the scores are:

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
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TextIO, Union

from torch import Tensor

from captum_diffmask.interface.html import legend_for, page, Row, table
from captum_diffmask.interface.verdicts import layer_verdict
from captum_diffmask.model.attribution import method_name, method_trait
from captum_diffmask.model.batches import split_batch
from captum_diffmask.model.texts import as_texts, merge_into_words, word_rule


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
        verdicts (list of str): per column, the convergence status of the
                    probe behind it (:func:`~captum_diffmask.interface.verdicts.layer_verdict`;
                    ``""`` for a method without a fit of its own); empty when
                    not known.
    """

    method: str
    texts: List[str]
    columns: List[str]
    rule: str
    tokens: List[List[str]] = field(default_factory=list)
    token_scores: List[Tensor] = field(default_factory=list)
    words: List[List[str]] = field(default_factory=list)
    word_scores: List[Tensor] = field(default_factory=list)
    verdicts: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        r"""Plain lists and floats (JSON-ready): the method, the columns, the
        rule and, per text, its tokens, words and both scores."""
        return {
            "method": self.method, "columns": list(self.columns), "rule": self.rule,
            "verdicts": list(self.verdicts),
            "examples": [
                {"text": text, "tokens": tokens, "token_scores": token_scores.tolist(),
                 "words": words, "word_scores": word_scores.tolist()}
                for text, tokens, token_scores, words, word_scores in zip(
                    self.texts, self.tokens, self.token_scores, self.words, self.word_scores)
            ],
        }

    def show(self, file: Optional[TextIO] = None) -> None:
        r"""Prints each text's words with their scores, a line per column (and
        its verdict, where it has one); attributions whose largest magnitude is
        under 0.1 or from 1 000 up print in a power of ten that each header
        states (:func:`print_unit`), so that two decimals show their order."""
        out = file if file is not None else sys.stdout
        verdicts = self.verdicts or [""] * len(self.columns)
        unit = 1.0 if self.rule == "max" else print_unit(self.word_scores)
        scale = "" if unit == 1.0 else f", scores in units of {unit:.0e}"
        for text, words, scores in zip(self.texts, self.words, self.word_scores):
            print(f"{self.method} ({self.rule} over word pieces{scale}): {text}", file=out)
            for k, column in enumerate(self.columns):
                cells = " ".join(f"{word}({float(score[k]) / unit:.2f})" for word, score in zip(words, scores))
                print(f"  {column:>9}: {cells}" + (f"  [{verdicts[k]}]" if verdicts[k] else ""), file=out)

    def __str__(self) -> str:
        buffer = io.StringIO()
        self.show(buffer)
        return buffer.getvalue()

    def to_html(self) -> str:
        r"""
        A self-contained HTML page: a legend, then per text one row per column,
        each word on a background whose strength is its score (keep
        probabilities on their absolute 0..1 scale, attributions scaled to the
        row's largest magnitude; green positive, red negative), the score in its
        tooltip, and each row's convergence verdict where it has one.
        """
        probabilities = self.rule == "max"
        verdicts = self.verdicts or [""] * len(self.columns)
        per_text = [[Row(column, words, scores[:, k].tolist(), probabilities, verdicts[k])
                     for k, column in enumerate(self.columns)]
                    for words, scores in zip(self.words, self.word_scores)]
        legend = legend_for([row for rows in per_text for row in rows])
        tables = [table(text, rows) for text, rows in zip(self.texts, per_text)]
        return page(self.method, f"({self.rule} over word pieces)", [legend] + tables)


    def to_captum(self, column: int = 0, predictions: Optional[Tensor] = None,
                  labels: Optional[Sequence[Any]] = None, target: Any = None) -> List[Any]:
        r"""
        The explanation as Captum's ``VisualizationDataRecord``\ s, one per text,
        for ``captum.attr.visualization.visualize_text``: the words with their
        scores (keep probabilities as they are, on 0..1; attributions over the
        text's largest magnitude, on -1..1, as Captum's colours take them).

        Args:

            column (int, optional): the score column shown (a depth of
                        DiffMask's ``layer=None``). Default: 0
            predictions (Tensor, optional): (B, C) the model's logits for the
                        texts, for Captum's "Predicted Label" column (the class
                        and its probability); without them it reads "-" (nan).
                        Default: None
            labels (sequence, optional): each text's true label. Default: None
            target (optional): the class attributed, for "Attribution Label"
                        (explain's ``target``; None: the prediction). Default: None

        Returns:
            *list* of ``VisualizationDataRecord``; its "Attribution Score" is
            the sum of the shown words' raw scores.
        """
        from captum.attr import visualization

        if not 0 <= column < len(self.columns):
            raise ValueError(f"column must be in 0..{len(self.columns) - 1} (the columns {self.columns}), got {column}")
        if predictions is not None and (predictions.dim() != 2 or predictions.shape[0] != len(self.texts)):
            raise ValueError(f"predictions must be (B, C) logits for the {len(self.texts)} texts, got "
                             f"{tuple(predictions.shape)}")
        records = []
        for b, (words, scores) in enumerate(zip(self.words, self.word_scores)):
            shown = scores[:, column].float()
            peak = float(shown.abs().max()) if shown.numel() else 0.0
            colours = shown if self.rule == "max" or peak == 0.0 else shown / peak
            probs = None if predictions is None else predictions[b].detach().float().softmax(-1)
            predicted = "-" if probs is None else int(probs.argmax())
            attributed = predicted if target is None else _of_example(target, b)
            records.append(visualization.VisualizationDataRecord(
                colours, float("nan") if probs is None else float(probs.max()), predicted,
                "-" if labels is None else labels[b], attributed, float(shown.sum()), list(words), float("nan")))
        return records


def _of_example(target: Any, b: int) -> Any:
    r"""Example ``b``'s target from one for all (an int) or one per example."""
    if isinstance(target, Tensor):
        return int(target[b]) if target.dim() > 0 else int(target)
    return target[b] if isinstance(target, (list, tuple)) else target


def print_unit(scores: Sequence[Tensor]) -> float:
    r"""
    The power of ten scores print in: 1 when the largest finite magnitude
    is in [0.1, 1000) or there is none, else ``10 ** floor(log10(largest))``.

    Args:

        scores (sequence of Tensor): any shapes.

    Returns:
        *float*: the unit.
    """
    finite = [s[s.isfinite()].abs().max() for s in scores if s.isfinite().any()]
    largest = float(max(finite)) if finite else 0.0
    if largest == 0.0 or 0.1 <= largest < 1000:
        return 1.0
    return float(10.0 ** math.floor(math.log10(largest)))


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
    layers = [layer] if len(columns) == 1 else list(range(len(columns)))
    result = Explanation(method_name(method), texts, columns, rule,
                         verdicts=[layer_verdict(method, k) for k in layers])
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
