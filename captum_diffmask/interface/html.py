"""Self-contained HTML pages of scores over tokens or words: one table per text,
a row per method or layer, each token on a background whose strength is its
score. Keep probabilities are drawn on their absolute 0..1 scale (a mask that
drops every token looks empty); other scores are scaled to the row's largest
magnitude, green for positive and red for negative. Every page carries a legend
that says so, and a row of a fitted probe says its layer's convergence verdict
(:mod:`captum_diffmask.interface.verdicts`)."""

from __future__ import annotations

import html
from typing import NamedTuple, Sequence

from captum_diffmask.interface.verdicts import is_check, is_settled, SETTLED_MEANINGS, UNSETTLED_MEANING

#: The shading: positive scores and keep probabilities green, negative red.
GREEN, RED = "0,160,0", "200,0,0"
#: The pages' one style sheet.
STYLE = ("body{font-family:sans-serif} th{text-align:right;padding-right:1em;font-weight:normal;color:#555;"
          "white-space:nowrap} .w{display:inline-block;margin:1px;padding:2px 4px;border-radius:3px} "
          ".verdict{padding-right:1em;white-space:nowrap} .settled{color:#176317} .unsettled{color:#b34700;"
          "font-weight:bold} .legend{margin:0.5em 0 1em;padding:0.5em;border:1px solid #ddd;max-width:60em} "
          ".swatch{display:inline-block;width:8em;height:0.9em;vertical-align:middle;border:1px solid #ccc} "
          ".metrics td,.metrics th{border-bottom:1px solid #eee;padding:2px 6px;text-align:right}")


class Row(NamedTuple):
    r"""One row of a table.

    Attributes:
        label (str): what the row is (a method, a layer).
        cells (sequence of str): the labels of its cells (tokens or words).
        scores (sequence of float): a score per cell.
        probabilities (bool): the scores are keep probabilities, drawn on the
                    absolute 0..1 scale.
        verdict (str): the convergence status of the probe behind the row
                    (``""``: a method without a fit of its own).
    """

    label: str
    cells: Sequence[str]
    scores: Sequence[float]
    probabilities: bool
    verdict: str = ""


def score_cells(labels: Sequence[str], scores: Sequence[float], probabilities: bool) -> str:
    r"""The HTML of one row's cells: each label on a background of its score's
    strength, the score in its tooltip and in ``data-score``."""
    scale = 1.0 if probabilities else max([abs(s) for s in scores] + [1e-12])
    return "".join(_cell(label, float(score), scale) for label, score in zip(labels, scores))


def _cell(label: str, score: float, scale: float) -> str:
    strength = max(min(abs(score) / scale, 1.0), 0.0)
    colour = GREEN if score >= 0 else RED
    return (f"<span class='w' title='{score:.4f}' data-score='{score:.6f}' "
            f"style='background:rgba({colour},{strength:.3f})'>{html.escape(label)}</span>")


def verdict_cell(verdict: str) -> str:
    r"""A verdict, styled by whether a reader may read the row (``data-verdict``
    holds it for scripts and tests)."""
    kind = "settled" if is_settled(verdict) else "unsettled"
    text = verdict if is_settled(verdict) or is_check(verdict) else f"not converged: {verdict}"
    return f"<span class='verdict {kind}' data-verdict='{html.escape(verdict)}'>{html.escape(text)}</span>"


def table(heading: str, rows: Sequence[Row]) -> str:
    r"""A heading and a table with a row per :class:`Row`; a verdict column when
    any row has a verdict."""
    with_verdicts = any(row.verdict for row in rows)
    body = "".join(
        f"<tr><th>{html.escape(row.label)}</th>"
        + (f"<td>{verdict_cell(row.verdict) if row.verdict else ''}</td>" if with_verdicts else "")
        + f"<td>{score_cells(row.cells, row.scores, row.probabilities)}</td></tr>"
        for row in rows)
    return f"<h3>{html.escape(heading)}</h3><table>{body}</table>"


def legend(probabilities: bool, signed: bool, verdicts: bool, checks: bool = False) -> str:
    r"""
    What the page's shading and verdicts mean.

    Args:

        probabilities (bool): the page has rows of keep probabilities.
        signed (bool): the page has rows of other scores.
        verdicts (bool): the page has rows with a convergence verdict.
        checks (bool, optional): the page has rows with a method's check of its
                    own numbers. Default: False

    Returns:
        *str*: a ``<div class='legend'>``.
    """
    parts = ["<b>Legend.</b> Each cell's value is in its tooltip."]
    if probabilities:
        parts.append(f"<br><span class='swatch' style='background:linear-gradient(to right,rgba({GREEN},0),"
                     f"rgba({GREEN},1))'></span> keep probability, on its absolute scale from 0 (white: the "
                     "token's gate closes, the output does not need it at this layer) to 1 (green: kept).")
    if signed:
        parts.append(f"<br><span class='swatch' style='background:linear-gradient(to right,rgba({RED},1),"
                     f"rgba({RED},0),rgba({GREEN},1))'></span> attribution over the row's largest magnitude: "
                     "red negative, white none, green positive.")
    if verdicts:
        settled = "; ".join(f"<b>{name}</b>: {meaning}" for name, meaning in SETTLED_MEANINGS.items())
        parts.append(f"<br>Verdict: the convergence status the layer's probe ended its fit with. {settled}; "
                     f"<b class='unsettled'>not converged</b>: {html.escape(UNSETTLED_MEANING)}.")
    if checks:
        parts.append("<br>Checked / failed check: a method's own measure of its numbers' error on this call "
                     "(Integrated Gradients: how far its signed attributions miss F(h) - F(b), relative to it) "
                     "within or over the method's tolerance.")
    return f"<div class='legend'>{''.join(parts)}</div>"


def legend_for(rows: Sequence[Row]) -> str:
    r"""The :func:`legend` of a page with these rows."""
    return legend(any(r.probabilities for r in rows), any(not r.probabilities and r.cells for r in rows),
                  any(r.verdict and not is_check(r.verdict) for r in rows), any(is_check(r.verdict) for r in rows))


def page(title: str, subtitle: str, parts: Sequence[str]) -> str:
    r"""A whole HTML document: the title, a subtitle and the parts (legend,
    tables), in order."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h2>{html.escape(title)} <small>{html.escape(subtitle)}</small>"
            f"</h2>{''.join(parts)}</body></html>")
