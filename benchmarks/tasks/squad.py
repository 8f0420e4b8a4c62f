r"""
SQuAD v1.1 for an extractive question-answering model: the reader, the split by
article, the windows a BERT-family model reads, the answer read back from its
start and end logits, and the official exact-match / F1 score.

Windows follow the Hugging Face question-answering recipe: ``[CLS] question [SEP]
context [SEP]``, the context cut into windows of ``max_length`` tokens that overlap
by ``doc_stride`` tokens (the question is never cut), and an answer that does not
lie whole inside a window is labelled with the ``[CLS]`` position (index 0) in that
window. A prediction takes the best-scoring span over every window of the
question, among spans that lie inside the context, start before they end and are
at most ``max_answer_tokens`` long.
"""

from __future__ import annotations

import collections
import json
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class SquadExample:
    r"""One question: its id, the article's title, the context, the question and
    the gold answers (texts and character offsets into the context)."""

    id: str
    title: str
    context: str
    question: str
    answers: Tuple[str, ...]
    answer_starts: Tuple[int, ...]


def read_squad(path: Union[str, Path]) -> List[SquadExample]:
    r"""
    The questions of a SQuAD v1.1 JSON file, in file order.

    Raises:
        FileNotFoundError naming the path; ValueError when the file is not SQuAD
        (no ``data`` list of articles).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD file not found: {path}")
    data = json.loads(path.read_text(encoding="utf-8")).get("data")
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a SQuAD file (no 'data' list of articles)")
    examples = []
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                examples.append(SquadExample(
                    id=qa["id"], title=article["title"], context=paragraph["context"], question=qa["question"],
                    answers=tuple(a["text"] for a in qa["answers"]),
                    answer_starts=tuple(int(a["answer_start"]) for a in qa["answers"])))
    return examples


def split_by_article(examples: Sequence[SquadExample], held_out: float = 0.2, seed: int = 0
                     ) -> Tuple[List[SquadExample], List[SquadExample]]:
    r"""
    (train, held-out) questions, split by article: a shuffled ``held_out`` share of
    the titles (at least one) holds all its questions out, so no passage is in both.
    """
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be in (0, 1), got {held_out!r}")
    titles = sorted({e.title for e in examples})
    if len(titles) < 2:
        raise ValueError(f"examples: a split by article needs at least two articles, got {len(titles)}")
    random.Random(seed).shuffle(titles)
    count = min(len(titles) - 1, max(1, round(held_out * len(titles))))
    kept_out = set(titles[:count])
    return [e for e in examples if e.title not in kept_out], [e for e in examples if e.title in kept_out]


@dataclass
class SquadFeatures:
    r"""
    The windows of a list of questions, as a model reads them.

    Attributes:
        input_ids, attention_mask, token_type_ids (Tensor): (N, max_length), right-padded.
        start_positions, end_positions (Tensor): (N,) the gold answer's first and last
                    token (the first gold answer), 0 ([CLS]) when it is not whole
                    inside the window.
        example_index (Tensor): (N,) the question each window belongs to.
        offsets (list): per window, per token, the (start, end) characters of the
                    token in the context, or None outside the context.
        question_offsets (list): per window, per token, the (start, end)
                    characters of the token in the question with its leading
                    spaces stripped (what the tokenizer read), or None outside
                    the question.
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    start_positions: Tensor
    end_positions: Tensor
    example_index: Tensor
    offsets: List[List[Optional[Tuple[int, int]]]]
    question_offsets: List[List[Optional[Tuple[int, int]]]]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def subset(self, rows: Sequence[int]) -> "SquadFeatures":
        r"""The windows ``rows``, in that order (``example_index`` unchanged: it
        still names the questions of the list the windows were encoded from)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        return SquadFeatures(
            input_ids=self.input_ids[index], attention_mask=self.attention_mask[index],
            token_type_ids=self.token_type_ids[index], start_positions=self.start_positions[index],
            end_positions=self.end_positions[index], example_index=self.example_index[index],
            offsets=[self.offsets[i] for i in index.tolist()],
            question_offsets=[self.question_offsets[i] for i in index.tolist()])

    def loader(self, batch_size: int, shuffle: bool = False, seed: Optional[int] = 0, sort_by_length: bool = True
               ) -> List[Tuple[Tensor, Tensor, Tensor]]:
        r"""
        The windows as a re-iterable list of ``(input_ids, attention_mask,
        token_type_ids)`` batches, each cut to its longest real length: what
        ``DiffMask.fit`` and every method read.

        Args:

            batch_size (int): windows per batch.
            shuffle (bool, optional): the batches in an order drawn from ``seed``.
                        Default: False
            seed (int, optional): the order's seed; None: drawn from torch's
                        global RNG (as the SST loader's). Default: 0
            sort_by_length (bool, optional): group windows of similar length
                        (the only grouping; kept for the loaders' common call).
                        Default: True

        Returns:
            *list* of tuples of (B, T') tensors.
        """
        return [(ids, mask, types) for _, ids, mask, types, _, _ in window_batches(self, batch_size, shuffle, seed)]


def window_batches(features: SquadFeatures, batch_size: int, shuffle: bool = False, seed: Optional[int] = 0
                   ) -> Iterator[Tuple[Tensor, ...]]:
    r"""
    Batches of windows cut to their longest real length: ``(rows, ids, mask,
    token types, starts, ends)``, rows being the windows' indices. Windows are
    grouped by length (less padding); with ``shuffle`` the groups come in an order
    drawn from ``seed`` (None: from torch's global RNG).
    """
    lengths = features.attention_mask.sum(1)
    order = torch.argsort(lengths, stable=True)
    groups = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        groups = [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]
    for rows in groups:
        width = int(lengths[rows].max())
        yield (rows, features.input_ids[rows, :width], features.attention_mask[rows, :width],
               features.token_type_ids[rows, :width], features.start_positions[rows], features.end_positions[rows])


def encode_squad(examples: Sequence[SquadExample], tokenizer: Any, max_length: int = 256, doc_stride: int = 128
                 ) -> SquadFeatures:
    r"""
    The windows of ``examples`` (see the module docstring); ``tokenizer`` is a fast
    Hugging Face tokenizer (it must return offset mappings).
    """
    if not doc_stride < max_length:
        raise ValueError(f"doc_stride must be < max_length, got {doc_stride} >= {max_length}")
    encoded = tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                        truncation="only_second", max_length=max_length, stride=doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    starts, ends, offsets, question_offsets = [], [], [], []
    for i, example_index in enumerate(encoded["overflow_to_sample_mapping"]):
        sequence_ids = encoded.sequence_ids(i)
        window = [tuple(o) if s == 1 else None for o, s in zip(encoded["offset_mapping"][i], sequence_ids)]
        offsets.append(window)
        question_offsets.append([tuple(o) if s == 0 else None for o, s in zip(encoded["offset_mapping"][i], sequence_ids)])
        example = examples[example_index]
        first = example.answer_starts[0]
        start, end = _answer_tokens(window, first, first + len(example.answers[0]))
        starts.append(start)
        ends.append(end)
    return SquadFeatures(
        input_ids=torch.tensor(encoded["input_ids"]), attention_mask=torch.tensor(encoded["attention_mask"]),
        token_type_ids=torch.tensor(encoded["token_type_ids"]), start_positions=torch.tensor(starts),
        end_positions=torch.tensor(ends), example_index=torch.tensor(encoded["overflow_to_sample_mapping"]),
        offsets=offsets, question_offsets=question_offsets)


def _answer_tokens(window: Sequence[Optional[Tuple[int, int]]], first: int, last: int) -> Tuple[int, int]:
    r"""The first and last token of the characters ``[first, last)`` in a window,
    or (0, 0) when they are not all inside it."""
    context = [i for i, o in enumerate(window) if o is not None]
    if not context or window[context[0]][0] > first or window[context[-1]][1] < last:
        return 0, 0
    start = next(i for i in context if window[i][1] > first)
    end = next(i for i in reversed(context) if window[i][0] < last)
    return start, end


def best_spans(features: SquadFeatures, start_logits: Tensor, end_logits: Tensor, num_examples: int,
               n_best: int = 20, max_answer_tokens: int = 30) -> List[Optional[Tuple[int, int, int]]]:
    r"""
    Per question, the best span over its windows as ``(window, start token, end
    token)``, or None when no window has a valid span.

    Args:

        features (SquadFeatures): the windows.
        start_logits, end_logits (Tensor): (N, max_length) the model's logits.
        num_examples (int): how many questions the windows belong to.
        n_best (int, optional): the top starts and ends tried per window. Default: 20
        max_answer_tokens (int, optional): the longest answer. Default: 30
    """
    best: List[Optional[Tuple[float, int, int, int]]] = [None] * num_examples
    for w in range(len(features)):
        window = features.offsets[w]
        starts = torch.topk(start_logits[w], min(n_best, start_logits.shape[1])).indices.tolist()
        ends = torch.topk(end_logits[w], min(n_best, end_logits.shape[1])).indices.tolist()
        q = int(features.example_index[w])
        for s in starts:
            for e in ends:
                if window[s] is None or window[e] is None or e < s or e - s + 1 > max_answer_tokens:
                    continue
                score = float(start_logits[w, s] + end_logits[w, e])
                if best[q] is None or score > best[q][0]:
                    best[q] = (score, w, s, e)
    return [None if b is None else b[1:] for b in best]


def span_text(example: SquadExample, features: SquadFeatures, span: Optional[Tuple[int, int, int]]) -> str:
    r"""The context's characters a ``(window, start, end)`` span covers ("" for None)."""
    if span is None:
        return ""
    w, s, e = span
    return example.context[features.offsets[w][s][0]:features.offsets[w][e][1]]


# ------------------------------------------------------------ official score
def normalize_answer(text: str) -> str:
    r"""The official SQuAD v1.1 normalisation: lower case, no punctuation, no
    articles (a, an, the), single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(prediction: str, gold: str) -> float:
    predicted, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = collections.Counter(predicted) & collections.Counter(truth)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], examples: Iterable[SquadExample]) -> Dict[str, Any]:
    r"""
    The official SQuAD v1.1 exact match and F1, in percent: per question the best
    over its gold answers, then the mean over ``examples`` (a question with no
    prediction scores 0).

    Returns:
        *dict* with ``exact_match``, ``f1`` and ``count``.
    """
    exact, f1, count = 0.0, 0.0, 0
    for example in examples:
        prediction = predictions.get(example.id, "")
        exact += max(float(normalize_answer(prediction) == normalize_answer(g)) for g in example.answers)
        f1 += max(_f1(prediction, g) for g in example.answers)
        count += 1
    if count == 0:
        raise ValueError("examples: no question to score")
    return {"exact_match": 100.0 * exact / count, "f1": 100.0 * f1 / count, "count": count}
