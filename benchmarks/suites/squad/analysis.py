"""The squad suite's numbers from keep probabilities: which group each token of
a window belongs to (question, passage, gold and predicted answer, [CLS],
[SEP], part of speech), the keep per layer of every group, and the gold answer
of the questions the model gets wrong. Pure functions of tensors and lists."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor

from benchmarks.tasks.squad import SquadFeatures

#: The token groups of the per-layer keep, in the report's order.
GROUPS = ["question", "passage", "gold answer", "predicted answer", "[CLS]", "[SEP]"]


def token_groups(
    windows: SquadFeatures, spans: Mapping[int, Optional[Tuple[int, int, int]]], cls_id: int, sep_id: int
) -> List[List[Set[str]]]:
    r"""
    The groups (:data:`GROUPS`) of every real token of every window: ``[CLS]``,
    ``[SEP]``, ``question`` (segment 0) or ``passage`` (segment 1), and within
    the passage ``gold answer`` (the first gold answer, when whole inside the
    window) and ``predicted answer`` (the model's span, in the window it was
    read from).

    Args:

        windows (SquadFeatures): the windows.
        spans (Mapping): question -> the model's ``(window, start, end)`` (a row
                    of ``windows``) or None.
        cls_id, sep_id (int): the special tokens' ids.

    Returns:
        *list* per window of a set of group names per real token.
    """
    predicted = {span[0]: span[1:] for span in spans.values() if span is not None}
    result = []
    for w in range(len(windows)):
        n = int(windows.attention_mask[w].sum())
        ids, types = windows.input_ids[w, :n].tolist(), windows.token_type_ids[w, :n].tolist()
        gold = (int(windows.start_positions[w]), int(windows.end_positions[w]))
        mine = predicted.get(w)
        row = []
        for t in range(n):
            if ids[t] in (cls_id, sep_id):
                row.append({"[CLS]" if ids[t] == cls_id else "[SEP]"})
                continue
            groups = {"question" if types[t] == 0 else "passage"}
            if gold[0] > 0 and gold[0] <= t <= gold[1]:
                groups.add("gold answer")
            if mine is not None and mine[0] <= t <= mine[1]:
                groups.add("predicted answer")
            row.append(groups)
        result.append(row)
    return result


def keep_by_group(keep: Sequence[Tensor], groups: Sequence[Sequence[Set[str]]], windows: Optional[Sequence[int]] = None
                  ) -> Dict[str, Dict[str, Any]]:
    r"""
    Per group, over its tokens in ``windows`` (all when None): the mean keep
    probability and the share kept (probability > 0.5, the deterministic gate)
    at each layer, and the expected number of layers kept (the sum of the keep
    probabilities over the layers).

    Args:

        keep (sequence of Tensor): per window (T, L + 1) keep probabilities.
        groups (sequence): per window, a set of group names per token.
        windows (sequence of int, optional): the windows counted.

    Returns:
        *dict* ``{group: {"keep": [L + 1], "kept_share": [L + 1],
        "mean_layers", "tokens"}}`` (keep and share in percent).
    """
    rows: Dict[str, List[Tensor]] = {}
    for w in (range(len(keep)) if windows is None else windows):
        for t, names in enumerate(groups[w]):
            for name in names:
                rows.setdefault(name, []).append(keep[w][t])
    result = {}
    for name, values in rows.items():
        matrix = torch.stack(values).float()  # (tokens, L + 1)
        result[name] = {"keep": (100.0 * matrix.mean(0)).tolist(), "kept_share": (100.0 * (matrix > 0.5).float().mean(0)).tolist(),
                        "mean_layers": float(matrix.sum(1).mean()), "tokens": int(matrix.shape[0])}
    return result


def windows_of(owner: Tensor, questions: Sequence[int], keep: Callable[[int], bool]) -> List[int]:
    r"""The windows (rows) whose question (``owner[w]``) is among ``questions``
    and passes ``keep``."""
    chosen = {q for q in questions if keep(q)}
    return [w for w, q in enumerate(owner.tolist()) if q in chosen]


def gold_when_wrong(
    keep: Sequence[Tensor], groups: Sequence[Sequence[Set[str]]], owner: Tensor, questions: Sequence[int],
    exact: Mapping[int, float], f1: Mapping[int, float],
) -> Dict[str, Any]:
    r"""
    The keep of the gold answer's tokens (and, for reference, of the passage)
    when the model's answer is wrong (exact match 0), entirely wrong (F1 0) and
    right (exact match 1), per layer.

    Args:

        keep, groups: as in :func:`keep_by_group`.
        owner (Tensor): (N,) the question of each window.
        questions (sequence of int): the analysed questions.
        exact, f1 (Mapping): per question, the model's exact match and F1 (0..1).

    Returns:
        *dict* ``{case: {"questions", "gold answer": ..., "passage": ...}}``,
        the groups as :func:`keep_by_group` gives them (absent when no window
        of the case holds its gold answer).
    """
    cases = {"wrong (EM 0)": lambda q: exact[q] == 0.0, "entirely wrong (F1 0)": lambda q: f1[q] == 0.0,
             "right (EM 1)": lambda q: exact[q] == 1.0}
    result: Dict[str, Any] = {}
    for case, test in cases.items():
        rows = windows_of(owner, questions, test)
        groups_kept = keep_by_group(keep, groups, rows)
        result[case] = {"questions": sum(1 for q in questions if test(q)),
                        **{g: groups_kept[g] for g in ("gold answer", "passage") if g in groups_kept}}
    return result


def pos_token_groups(
    windows: SquadFeatures, question_tags: Sequence[Sequence[str]], context_tags: Sequence[Sequence[str]]
) -> List[List[Set[str]]]:
    r"""
    The part-of-speech groups of every real token of every window: ``all:TAG``
    and ``question:TAG`` or ``context:TAG``, the tag being that of the word
    (spaCy token) under the token's first character; special tokens have none.

    Args:

        windows (SquadFeatures): the windows (``offsets``, ``question_offsets``).
        question_tags, context_tags (sequence): per window, a UPOS tag per
                    character of its question (as tokenised, leading spaces
                    stripped) and of its context ("" on spaces).

    Returns:
        *list* per window of a set of group names per real token.
    """
    result = []
    for w in range(len(windows)):
        n = int(windows.attention_mask[w].sum())
        row = []
        for t in range(n):
            names: Set[str] = set()
            for segment, offsets, tags in (("question", windows.question_offsets[w], question_tags[w]),
                                           ("context", windows.offsets[w], context_tags[w])):
                span = offsets[t]
                if span is not None and span[1] > span[0] and tags[span[0]]:
                    names = {f"all:{tags[span[0]]}", f"{segment}:{tags[span[0]]}"}
            row.append(names)
        result.append(row)
    return result
