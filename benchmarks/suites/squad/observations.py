"""The paper's five observations on SQuAD (Section 6.2) read against this run's
numbers: for each, what we measured, the criterion, and whether it holds.

Every criterion is fixed here, before any run, and printed in the report:

- *question deeper*: input mode, the expected number of layers a question token
  is kept exceeds that of a passage token (hidden mode reported beside);
- *prediction kept*: input mode, the masked model's answer matches its own
  unmasked answer (exact match) on more than 90 % of the questions at every
  layer, including the questions with more than 95 % of their tokens masked;
- *gold when wrong*: input mode, on the questions answered wrongly (exact match
  0), the share of the gold answer's tokens kept (deterministic gates, averaged
  over the layers) lies within 45-75 % ("about 60 %");
- *POS order*: input mode, over the parts of speech with at least
  :data:`MIN_POS_TOKENS` tokens ranked by the expected layers kept, CCONJ and
  ADP lie in the lowest third and PROPN and PUNCT in the highest third;
- *[SEP] kept*: hidden mode, at least 90 % of the [SEP] states are kept at every
  layer but the last, and at the last fewer than 50 %.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Mapping

from benchmarks.suites.squad.settings import OBSERVATIONS

#: The fewest tokens a part of speech needs to be ranked.
MIN_POS_TOKENS = 50


def _verdict(parts: List[bool]) -> str:
    return "holds" if all(parts) else ("partly" if any(parts) else "does not hold")


def question_deeper(keep: Mapping[str, Any]) -> Dict[str, Any]:
    r"""Question against passage tokens: expected layers kept, per mode."""
    rows = {mode: (keep[mode]["question"]["mean_layers"], keep[mode]["passage"]["mean_layers"]) for mode in keep}
    ours = "; ".join(f"{mode}: question {q:.2f} vs passage {p:.2f} layers" for mode, (q, p) in rows.items())
    q, p = rows["input"]
    return {"ours": ours, "verdict": "holds" if q > p else "does not hold"}


def prediction_kept(agreement: Mapping[str, List[Mapping[str, Any]]]) -> Dict[str, Any]:
    r"""The masked model's answer against its own, per layer, and where more
    than 95 % of the tokens are masked (input mode decides)."""
    rows = agreement["input"]
    lowest = min(rows, key=lambda r: r["same_exact_match"])
    sparse = [r for r in rows if r["over_95_questions"] > 0]
    ours = (f"input: same answer on {min(r['same_exact_match'] for r in rows):.1f}-"
            f"{max(r['same_exact_match'] for r in rows):.1f} % of the questions across layers (lowest at layer "
            f"{lowest['layer']}, {lowest['masked_share']:.1f} % masked); largest masked share "
            f"{max(r['masked_share'] for r in rows):.1f} %")
    if sparse:
        ours += "; questions with > 95 % masked: " + ", ".join(
            f"layer {r['layer']}: {r['over_95_same_exact_match']:.1f} % of {r['over_95_questions']}" for r in sparse)
    else:
        ours += "; no question has more than 95 % of its tokens masked at any layer"
    hidden = agreement.get("hidden")
    if hidden:
        ours += (f". Hidden: {min(r['same_exact_match'] for r in hidden):.1f}-{max(r['same_exact_match'] for r in hidden):.1f} %"
                 f", largest masked share {max(r['masked_share'] for r in hidden):.1f} %")
    parts = [all(r["same_exact_match"] > 90.0 for r in rows),
             bool(sparse) and all(r["over_95_same_exact_match"] > 90.0 for r in sparse)]
    return {"ours": ours, "verdict": _verdict(parts)}


def gold_when_wrong(cases: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    r"""The gold answer's tokens kept on wrongly answered questions (input mode
    decides), averaged over the layers."""
    parts, texts = [], []
    for mode, by_case in cases.items():
        wrong = by_case["wrong (EM 0)"]
        if "gold answer" not in wrong:
            texts.append(f"{mode}: no wrongly answered question has its gold answer inside a window")
            continue
        share = statistics.mean(wrong["gold answer"]["kept_share"])
        passage = statistics.mean(wrong["passage"]["kept_share"])
        texts.append(f"{mode}: {share:.1f} % of the gold answer's tokens kept (mean over layers; passage "
                     f"{passage:.1f} %; {wrong['questions']} wrong questions)")
        if mode == "input":
            parts.append(45.0 <= share <= 75.0)
    return {"ours": "; ".join(texts), "verdict": _verdict(parts) if parts else "not measured"}


def pos_order(pos: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    r"""Where CCONJ, ADP, PROPN and PUNCT rank by expected layers kept (input)."""
    if not pos:
        return {"ours": "not measured (the POS tagger is not installed)", "verdict": "not measured"}
    groups = {name[4:]: v["mean_layers"] for name, v in pos["input"].items()
              if name.startswith("all:") and v["tokens"] >= MIN_POS_TOKENS}
    ranked = sorted(groups, key=lambda g: groups[g])
    third = max(1, math.ceil(len(ranked) / 3))
    low, high = set(ranked[:third]), set(ranked[-third:])
    rank = {g: i + 1 for i, g in enumerate(ranked)}
    ours = f"input, {len(ranked)} parts of speech ranked from dropped first: " + ", ".join(
        f"{g} {rank[g]} ({groups[g]:.2f} layers)" if g in rank else f"{g} (too rare)" for g in ("CCONJ", "ADP", "PROPN", "PUNCT"))
    ours += f"; dropped first: {', '.join(ranked[:3])}; kept longest: {', '.join(ranked[-3:][::-1])}"
    parts = [g in low for g in ("CCONJ", "ADP")] + [g in high for g in ("PROPN", "PUNCT")]
    return {"ours": ours, "verdict": _verdict(parts)}


def sep_kept(keep: Mapping[str, Any]) -> Dict[str, Any]:
    r"""The share of [SEP] states kept per layer (hidden mode)."""
    shares = keep["hidden"]["[SEP]"]["kept_share"]
    ours = "hidden: [SEP] states kept " + ", ".join(f"{s:.0f} %" for s in shares) + " at layers 0.." + str(len(shares) - 1)
    parts = [all(s >= 90.0 for s in shares[:-1]), shares[-1] < 50.0]
    return {"ours": ours, "verdict": _verdict(parts)}


#: The DiffMask mode each observation is read from (its probes are the ones it rests on).
OBSERVATION_MODES = {"question_deeper": "input", "prediction_kept": "input", "gold_when_wrong": "input",
                     "pos_order": "input", "sep_kept": "hidden"}


def observations(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""
    The five observations, each ``{"key", "paper", "ours", "verdict"}``.

    Args:

        results (Mapping): the suite's ``keep``, ``agreement``,
                    ``gold_when_wrong`` and ``pos`` (empty without the tagger).

    Returns:
        *list* of dicts in the paper's order.
    """
    read = {"question_deeper": lambda: question_deeper(results["keep"]),
            "prediction_kept": lambda: prediction_kept(results["agreement"]),
            "gold_when_wrong": lambda: gold_when_wrong(results["gold_when_wrong"]),
            "pos_order": lambda: pos_order(results.get("pos") or {}),
            "sep_kept": lambda: sep_kept(results["keep"])}
    return [{"key": key, "paper": OBSERVATIONS[key], **read[key]()} for key in OBSERVATIONS]
