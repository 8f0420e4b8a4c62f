"""The squad suite's few examples: which windows are shown, the crop of a window
the figures draw, and every method of the paper's comparison figure run on them
side by side (amortised DiffMask, per-example DiffMask, budgeted exact erasure,
Integrated Gradients, the per-sample bottleneck and Guan)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import Tensor

from captum_diffmask import DiffMask
from captum_diffmask.model.forward import model_device

from benchmarks.methods import MethodContext, prepare
from benchmarks.progress import error_text, log_to_stderr
from benchmarks.common.minilm.fitting import OnDevice
from benchmarks.suites.squad.analysis import token_groups
from benchmarks.suites.squad.loading import Bench
from benchmarks.suites.squad.settings import SIDE_BY_SIDE


def select_examples(bench: Bench, count: int, max_tokens: int) -> List[int]:
    r"""
    Windows to show: of the analysed questions read in one window of at most
    ``max_tokens`` real tokens, one per passage, the ``count`` shortest (chosen
    by length alone, so that budgeted exact erasure can finish; fewer when
    fewer qualify).

    Returns:
        *list* of rows of ``bench.windows``.
    """
    owner = bench.windows.example_index.tolist()
    windows_per_question = Counter(owner)
    lengths = bench.windows.attention_mask.sum(1).tolist()
    seen, chosen = set(), []
    for w in sorted(range(len(owner)), key=lambda w: (lengths[w], w)):
        context = bench.held_out[owner[w]].context
        if windows_per_question[owner[w]] == 1 and lengths[w] <= max_tokens and context not in seen:
            seen.add(context)
            chosen.append(w)
        if len(chosen) == count:
            break
    return chosen


def crop(bench: Bench, row: int, width: int) -> List[int]:
    r"""The positions of window ``row`` a figure shows: ``[CLS]``, the question
    and its ``[SEP]``, then the passage around the gold answer (centred on it),
    at most ``width`` positions in all, in order."""
    n = int(bench.windows.attention_mask[row].sum())
    types = bench.windows.token_type_ids[row, :n].tolist()
    question = [t for t in range(n) if types[t] == 0]
    passage = [t for t in range(n) if types[t] == 1]
    room = max(0, width - len(question))
    start, end = int(bench.windows.start_positions[row]), int(bench.windows.end_positions[row])
    middle = passage.index(start) if start in passage else 0
    first = max(0, min(middle - room // 2 + max(0, end - start) // 2, len(passage) - room))
    return question + passage[first : first + room]


def composition(scores: Tensor, groups: Sequence[set]) -> Dict[str, float]:
    r"""The share (percent) of a window's non-negative scores (T,) on its
    predicted answer, the rest of the question, the rest of the passage and the
    special tokens."""
    weights = scores.clamp(min=0).double()
    total = float(weights.sum()) or 1.0
    shares = {"predicted answer": 0.0, "question": 0.0, "other passage": 0.0, "[CLS]/[SEP]": 0.0}
    for t, names in enumerate(groups):
        key = ("predicted answer" if "predicted answer" in names else "question" if "question" in names
               else "other passage" if "passage" in names else "[CLS]/[SEP]")
        shares[key] += 100.0 * float(weights[t]) / total
    return shares


def run_side_by_side(
    config: Mapping[str, Any], bench: Bench, explainer: DiffMask, rows: List[int], seed: int, verbose: bool
) -> Dict[str, Any]:
    r"""
    Every method of :data:`SIDE_BY_SIDE` and amortised DiffMask (input mode,
    the keep averaged over the layers, as the paper's comparison figure) on the
    windows ``rows`` at the input, in one batch.

    Args:

        config (Mapping): ``method_options`` per method.
        bench (Bench): the model, the windows and the training windows (the
                    bottleneck's statistics).
        explainer (DiffMask): the fitted input-mode DiffMask.
        rows (list of int): the windows.
        seed (int): the methods' seed.
        verbose (bool): progress bars and a line per failure.

    Returns:
        *dict*: ``scores`` (method -> (B, T) tensor), ``records`` (method ->
        seconds per window, options, status, composition, and for exact erasure
        the search's outcome).
    """
    device = model_device(bench.model)
    ids, mask, types = (t.to(device) for t in _batch(bench, rows))
    groups = _groups(bench, rows)
    start = time.perf_counter()
    scores: Dict[str, Tensor] = {"DiffMask (input, mean over layers)": explainer.attribute(
        ids, additional_forward_args=(mask, types), layer=None).mean(-1)}
    records: Dict[str, Dict[str, Any]] = {"DiffMask (input, mean over layers)": {
        "status": "ok", "seconds_per_window": (time.perf_counter() - start) / len(rows)}}
    ctx = MethodContext(model=bench.model, sites=lambda: None, padding_mask_arg="auto",
                        train_loader=lambda size, s: OnDevice(bench.train.loader(size, shuffle=True, seed=s), device),
                        layer=0,
                        seed=seed, verbose=False)
    for name in SIDE_BY_SIDE:
        options = dict(config.get("method_options", {}).get(name, {}))
        record: Dict[str, Any] = {"options": options}
        try:
            value, extra = _attribute(name, options, ctx, ids, mask, types)
            scores[name] = value
            record.update({"status": "ok", **extra})
        except Exception as error:  # noqa: BLE001 - one failing method must not sink the suite
            record.update({"status": "failed", "error": error_text(error)})
            log_to_stderr(verbose, f"[squad] {name} failed: {record['error']}")
        records[name] = record
    scores = {k: v.detach().float().cpu() for k, v in scores.items()}
    for name, value in scores.items():
        records[name]["composition"] = [composition(value[i, : len(groups[i])], groups[i]) for i in range(len(rows))]
    return {"scores": scores, "records": records}


def _batch(bench: Bench, rows: List[int]) -> Tuple[Tensor, Tensor, Tensor]:
    index = torch.as_tensor(rows)
    width = int(bench.windows.attention_mask[index].sum(1).max())
    return (bench.windows.input_ids[index, :width], bench.windows.attention_mask[index, :width],
            bench.windows.token_type_ids[index, :width])


def _groups(bench: Bench, rows: List[int]) -> List[List[set]]:
    r"""The token groups of the windows ``rows`` (with the model's answers)."""
    spans = {q: s for q, s in bench.spans.items() if s is not None and s[0] in rows}
    renumbered = {q: (rows.index(s[0]), s[1], s[2]) for q, s in spans.items()}
    return token_groups(bench.windows.subset(rows), renumbered, bench.tokenizer.cls_token_id, bench.tokenizer.sep_token_id)


def _attribute(name: str, options: Mapping[str, Any], ctx: MethodContext, ids: Tensor, mask: Tensor, types: Tensor
               ) -> Tuple[Tensor, Dict[str, Any]]:
    r"""One method's (B, T) input attributions and its record's extras (the
    time per window; for exact erasure the search's outcome)."""
    handle = prepare(name, ctx, options)
    start = time.perf_counter()
    extra: Dict[str, Any] = {"setup_seconds": handle.setup_seconds}
    if name == "ExactErasure":
        result = handle.explainer.search(ids, (mask, types), layer=0)
        value = result.masks
        extra.update({"solved": result.solved.tolist(), "size": result.size.tolist(),
                      "evaluations": result.num_evaluations.tolist()})
    else:
        torch.manual_seed(ctx.seed)
        value = handle.attribute(ids, (mask, types), 0)
    extra["seconds_per_window"] = (time.perf_counter() - start) / ids.shape[0]
    return value, extra
