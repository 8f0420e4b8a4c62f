"""The sst suite's numbers: pure functions from predictions, attributions and
per-seed runs to the results' scores (faithfulness, stability, the [CLS]
share, the layers a token is kept)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_diffmask import seed_std
from benchmarks.tasks.sst import LABEL_NAMES, SSTSentence
from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.common.minilm.convergence import probe_counts


def by_layer(runs: Sequence[Mapping[str, Any]]) -> Dict[int, List[Dict[str, Any]]]:
    r"""Per layer, in order, the rows of the faithfulness scores ``runs`` (one
    per seed) that have it: a seed fitted at some layers only is left out of
    the others."""
    rows: Dict[int, List[Dict[str, Any]]] = {}
    for run in runs:
        for row in run["per_layer"]:
            rows.setdefault(int(row["layer"]), []).append(row)
    return dict(sorted(rows.items()))


def layer_row(faithfulness: Mapping[str, Any], layer: int) -> Dict[str, Any]:
    r"""One seed's faithfulness scores at ``layer`` (its ``per_layer`` row)."""
    return next(row for row in faithfulness["per_layer"] if int(row["layer"]) == int(layer))


def mean_faithfulness(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    r"""Per layer, the mean and std over the seeds fitted there (``seeds``) of
    each faithfulness number; the mean over them of the macro-F1 change's 95 %
    interval width and of the changed predictions' median top-2 gap, when the
    scores have them."""
    layers = []
    for layer, rows in by_layer(runs).items():
        entry: Dict[str, Any] = {"layer": layer, "seeds": len(rows)}
        for key in ("macro_f1", "accuracy", "masked_share", "agreement"):
            values = [row[key] for row in rows]
            entry[key] = statistics.mean(values)
            entry[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        if all("f1_change_interval" in row for row in rows):  # scores from before these were measured lack them
            entry["f1_change_interval_width"] = statistics.mean(row["f1_change_interval"][1] - row["f1_change_interval"][0]
                                                                for row in rows)
            gaps = [row["changed"]["median_top2_gap"] for row in rows if row["changed"]["count"]]
            entry["changed_top2_gap"] = statistics.mean(gaps) if gaps else None
        layers.append(entry)
    return {"unmasked": runs[0]["unmasked"], "per_layer": layers}


def aggregate_std(runs: Sequence[Mapping[str, Any]], layers: Sequence[int]) -> float:
    r"""The std across seeds of each layer's masked share (a fraction), averaged
    over ``layers``: the stability of the aggregate, beside that of each keep
    probability. ``runs``: each seed's faithfulness scores."""
    rows = by_layer(runs)
    stds = [statistics.stdev([r["masked_share"] / 100.0 for r in rows[k]]) if len(rows[k]) > 1 else 0.0 for k in layers]
    return statistics.mean(stds)


def stability(per_seed: List[List[Tensor]]) -> Optional[Dict[str, Any]]:
    r"""The std across seeds of every (sentence, token, layer) attribution
    (:func:`captum_diffmask.seed_std` over the sentences laid end to end), its
    mean, 95th percentile and max, and per layer; None with fewer than two seeds."""
    if len(per_seed) < 2:
        return None
    # one "batch" row of every sentence's tokens: (1, tokens, layers)
    return seed_std([torch.cat(list(sentences)).unsqueeze(0) for sentences in per_seed])


def cls_is_largest(scores: Tensor) -> Tuple[bool, bool]:
    r"""(T,) scores of one sentence: ``[CLS]`` (position 0) strictly largest, or
    tied for largest."""
    top = scores.max()
    strict = bool(scores[0] == top) and int((scores == top).sum()) == 1
    return strict, bool(scores[0] == top) and not strict


def cls_share(scores: List[Tensor]) -> Dict[str, Any]:
    r"""The share of sentences (per-sentence (T,) ``scores``) whose ``[CLS]`` is
    strictly largest, and tied for largest, in percent; and their number."""
    flags = [cls_is_largest(s) for s in scores]
    return {"cls_share": 100.0 * sum(f[0] for f in flags) / max(len(flags), 1),
            "cls_tie_share": 100.0 * sum(f[1] for f in flags) / max(len(flags), 1), "sentences": len(flags)}


def layers_kept_by_group(
    attributions: List[Tensor], data: EncodedSST, groups_of: Callable[[int, SSTSentence], Sequence[str]],
) -> Dict[str, Dict[str, float]]:
    r"""The mean over tokens of the expected number of layers a token is kept (the
    sum of its keep probabilities over layers 0..L), by group; a word's tokens
    belong to the word's group, ``[CLS]`` and ``[SEP]`` to their own."""
    sums: Dict[str, List[float]] = {}
    for row, keep in enumerate(attributions):
        expected = keep.sum(-1)  # (T,)
        word_index = data.word_index[row, : len(expected)]
        labels = groups_of(row, data.sentences[row])
        for t, w in enumerate(word_index.tolist()):
            group = ("[CLS]" if t == 0 else "[SEP]") if w < 0 else labels[w]
            acc = sums.setdefault(group, [0.0, 0.0])
            acc[0] += float(expected[t])
            acc[1] += 1.0
    return {g: {"mean_layers": s / n, "tokens": int(n)} for g, (s, n) in sums.items()}


def label_groups(row: int, sentence: SSTSentence) -> Sequence[str]:
    r"""The group of each word of a sentence: its own SST sentiment label (for
    :func:`layers_kept_by_group`)."""
    return [LABEL_NAMES[label] for label in sentence.word_labels]


def cls_share_table(hidden_last: List[Tensor], method_records: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    r"""
    The results' ``cls_share``: DiffMask's (hidden mode, first seed) and that
    of every method that ran.

    Args:

        hidden_last (list of Tensor): per sentence, DiffMask's (T,) hidden-state
                    attributions at the last layer.
        method_records (Mapping): the other methods' records, with their shares.

    Returns:
        *dict* ``{method: {"cls_share", "cls_tie_share", "sentences"}}``.
    """
    cls_shares = {"DiffMask (hidden)": cls_share(hidden_last)}
    for name, record in method_records.items():
        if record["status"] == "ok":
            cls_shares[name] = {k: record[k] for k in ("cls_share", "cls_tie_share", "sentences")}
    return cls_shares


def layer_means(faithfulness: Mapping[str, Any]) -> Tuple[float, float]:
    r"""The masked share and the masked model's macro-F1 of one mode, each
    averaged over the probes of every layer (``faithfulness`` as from
    :func:`mean_faithfulness`)."""
    layers = faithfulness["per_layer"]
    return statistics.mean(r["masked_share"] for r in layers), statistics.mean(r["macro_f1"] for r in layers)


def counted_layers(run: Mapping[str, Any]) -> Dict[int, Dict[str, Any]]:
    r"""
    Per layer of one fit, whether its probe counts
    (:func:`~benchmarks.common.minilm.convergence.probe_counts`): ``settled``
    (the fit's own verdict is ``converged`` or ``needed``), ``within`` (its
    deterministic read-out's held-out KL within the bound; True when the run
    scored none, a selected checkpoint's), ``certified`` (the convergence
    certificate counts it; None when the run has no certificate) and
    ``counts`` (all three; an unknown certificate does not stop it).

    Args:

        run (Mapping): one seed's record (``convergence``, ``options``, and
                    ``heldout`` when no checkpoint was selected; ``certificate``
                    when it was measured).

    Returns:
        *dict* ``layer -> {"settled", "within", "certified", "counts"}``.
    """
    eps = run.get("options", {}).get("eps")
    heldout = run.get("heldout") or {}
    certificate = (run.get("certificate") or {}).get("layers")
    counted = {}
    for layer, report in (run.get("convergence") or {}).items():
        settled, within = probe_counts(report["status"], (heldout.get(str(layer)) or {}).get("kl"), eps)
        certified = None if certificate is None else bool(certificate[str(layer)]["counted"])
        counted[int(layer)] = {"settled": settled, "within": within, "certified": certified,
                               "counts": settled and within and certified is not False}
    return counted
