"""The ERASER-style export: the human rationales in ERASER's annotation format
and, per method, its rationales in ERASER's prediction format (``annotation_id``,
``rationales`` with ``docid``, ``hard_rationale_predictions`` spans and
``soft_rationale_predictions`` per word), one JSON line per sentence. Tokens
are SST's words: a word's score is the largest of its word pieces'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch import Tensor

from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.suites.faithfulness.rationales import word_tokens


def _word_scores(scores: Tensor, word_index: Tensor, words: int) -> List[float]:
    r"""A word's score: the largest of its word pieces' (ERASER scores words)."""
    out = [float("-inf")] * words
    for position, word in enumerate(word_index.tolist()[: len(scores)]):
        if word >= 0:
            out[word] = max(out[word], float(scores[position]))
    return [0.0 if v == float("-inf") else v for v in out]


def _spans(flags: Sequence[bool]) -> List[Dict[str, int]]:
    spans, start = [], None
    for i, flag in enumerate(list(flags) + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            spans.append({"start_token": start, "end_token": i})
            start = None
    return spans


def annotation(row: int, data: EncodedSST, rationale: Tensor) -> Dict[str, Any]:
    r"""One sentence in ERASER's annotation format: ``annotation_id``,
    ``classification`` (the SST label), ``evidences`` (the rationale's word
    spans, each with its ``docid``, ``start_token``, ``end_token`` and
    ``text``), and ``tokens`` (the SST words; ERASER keeps them in its docs)."""
    sentence, index = data.sentences[row], data.word_index[row]
    marked = [False] * len(sentence.words)
    for position in (rationale[row] & word_tokens(data)[row]).nonzero().flatten().tolist():
        marked[int(index[position])] = True
    docid = f"sst-{row}"
    evidences = [{**span, "docid": docid, "text": " ".join(sentence.words[span["start_token"]:span["end_token"]])}
                 for span in _spans(marked)]
    return {"annotation_id": docid, "classification": int(sentence.label), "evidences": [evidences],
            "query": "sentiment", "query_type": None, "tokens": list(sentence.words)}


def prediction(row: int, data: EncodedSST, scores: Tensor, top: float = 0.2) -> Dict[str, Any]:
    r"""One sentence's rationale in ERASER's prediction format: per-word
    ``soft_rationale_predictions`` (a word's largest word-piece score) and the
    top ``top`` share of the words as ``hard_rationale_predictions`` spans."""
    sentence, docid = data.sentences[row], f"sst-{row}"
    words = len(sentence.words)
    soft = _word_scores(scores, data.word_index[row], words)
    chosen = set(sorted(range(words), key=lambda i: -soft[i])[: max(1, round(top * words))])
    hard = _spans([i in chosen for i in range(words)])
    return {"annotation_id": docid, "rationales": [
        {"docid": docid, "hard_rationale_predictions": hard, "soft_rationale_predictions": soft}]}


def write_jsonl(out_dir: Path, data: EncodedSST, scores: Mapping[str, Sequence[Tensor]], rationale: Tensor,
                limit: Optional[int] = None) -> Dict[str, Any]:
    r"""
    Writes ``out_dir/eraser/annotations.jsonl`` (:func:`annotation`) and one
    ``out_dir/eraser/METHOD.jsonl`` per score set (:func:`prediction`) for the
    first ``limit`` sentences (all when None).

    Returns:
        *dict*: the folder, the files and the line count.
    """
    folder = out_dir / "eraser"
    folder.mkdir(parents=True, exist_ok=True)
    rows = range(len(data) if limit is None else min(int(limit), len(data)))
    files = {"annotations": "annotations.jsonl"}
    with open(folder / files["annotations"], "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(annotation(row, data, rationale)) + "\n")
    for name, per_sentence in scores.items():
        files[name] = name.replace(" ", "_") + ".jsonl"
        with open(folder / files[name], "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(prediction(row, data, per_sentence[row])) + "\n")
    return {"folder": "eraser", "files": files, "lines": len(rows)}
