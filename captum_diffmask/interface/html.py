"""Self-contained HTML pages of scores over tokens or words: one table per text,
a row per method or layer, each token on a background whose strength is its
score. Keep probabilities are drawn on their absolute 0..1 scale (a mask that
drops every token looks empty); other scores are scaled to the row's largest
magnitude, green for positive and red for negative."""

from __future__ import annotations

import html
from typing import Sequence, Tuple

_STYLE = ("body{font-family:sans-serif} th{text-align:right;padding-right:1em;font-weight:normal;color:#555;"
          "white-space:nowrap} .w{display:inline-block;margin:1px;padding:2px 4px;border-radius:3px}")

#: One row: its label, the labels of its cells, their scores, and whether the
#: scores are probabilities (drawn on the absolute 0..1 scale).
Row = Tuple[str, Sequence[str], Sequence[float], bool]


def score_cells(labels: Sequence[str], scores: Sequence[float], probabilities: bool) -> str:
    r"""The HTML of one row's cells: each label on a background of its score's
    strength, the score in its tooltip and in ``data-score``."""
    scale = 1.0 if probabilities else max([abs(s) for s in scores] + [1e-12])
    return "".join(_cell(label, float(score), scale) for label, score in zip(labels, scores))


def _cell(label: str, score: float, scale: float) -> str:
    strength = max(min(abs(score) / scale, 1.0), 0.0)
    colour = "0,160,0" if score >= 0 else "200,0,0"
    return (f"<span class='w' title='{score:.4f}' data-score='{score:.6f}' "
            f"style='background:rgba({colour},{strength:.3f})'>{html.escape(label)}</span>")


def table(heading: str, rows: Sequence[Row]) -> str:
    r"""A heading and a table with a row per :data:`Row`."""
    body = "".join(f"<tr><th>{html.escape(label)}</th><td>{score_cells(cells, scores, probabilities)}</td></tr>"
                   for label, cells, scores, probabilities in rows)
    return f"<h3>{html.escape(heading)}</h3><table>{body}</table>"


def page(title: str, subtitle: str, tables: Sequence[str]) -> str:
    r"""A whole HTML document: the title, a subtitle and the tables."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h2>{html.escape(title)} <small>{html.escape(subtitle)}</small>"
            f"</h2>{''.join(tables)}</body></html>")
