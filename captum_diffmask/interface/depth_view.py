"""The page that shows when a model knows: one self-contained HTML view of
DiffMask's keep probabilities at every depth, a slider over the layers, each
layer's convergence verdict, a legend, and other methods' rows beside.

The view reads an :class:`~captum_diffmask.interface.explanation.Explanation`
of DiffMask at every layer (``explain(dm, texts, tokenizer, layer=None)``): in
input mode a word's score at layer k is the probability that a probe reading up
to depth k keeps it; in hidden mode, that the state of ``hidden.k`` is kept.
Moving the slider shades the words with the chosen layer's scores; a grid below
shows every layer at once. The page needs no network: its data and its one
script are inline. ``page.html#layer=K`` opens it at layer K.
"""

from __future__ import annotations

import html
import json
from typing import Optional, Sequence

from captum_diffmask.interface.explanation import Explanation
from captum_diffmask.interface.html import GREEN, legend, Row, score_cells, STYLE, table, verdict_cell

__all__ = ["depth_view"]

_SCRIPT = """
const view = JSON.parse(document.getElementById('depth-data').textContent);
const slider = document.getElementById('depth');
function show(k) {
  document.getElementById('depth-label').textContent = view.columns[k];
  document.getElementById('depth-verdict').innerHTML = view.verdicts[k];
  document.querySelectorAll('span.d').forEach(function (cell) {
    const p = view.scores[+cell.dataset.text][+cell.dataset.word][k];
    cell.dataset.score = p.toFixed(6);
    cell.title = p.toFixed(4);
    cell.style.background = 'rgba(' + view.colour + ',' + Math.min(Math.max(p, 0), 1).toFixed(3) + ')';
  });
}
slider.addEventListener('input', function () { show(+slider.value); });
const asked = /layer=(\\d+)/.exec(location.hash);
slider.value = asked ? Math.min(+asked[1], view.columns.length - 1) : view.columns.length - 1;
slider.dispatchEvent(new Event('input'));
"""


def depth_view(diffmask: Explanation, others: Sequence[Explanation] = (), title: Optional[str] = None) -> str:
    r"""
    One self-contained HTML page of DiffMask's scores over depth.

    Args:

        diffmask (Explanation): DiffMask at every layer (``explain(dm, texts,
                    tokenizer, layer=None)``: columns ``layer 0 .. layer L``,
                    keep probabilities, each layer's verdict).
        others (sequence of Explanation, optional): other methods on the same
                    texts (one column each), drawn as rows beside DiffMask's.
                    Default: ()
        title (str, optional): the page's title. Default: "When the model knows"

    Returns:
        *str*: the page.

    Raises:
        ValueError: when ``diffmask`` is not keep probabilities over several
        layers, or an other method's texts or words differ.
    """
    _check(diffmask, others)
    verdicts = diffmask.verdicts or [""] * len(diffmask.columns)
    data = {"columns": diffmask.columns, "colour": GREEN,
            "verdicts": [verdict_cell(v) if v else "" for v in verdicts],
            "scores": [scores.tolist() for scores in diffmask.word_scores]}
    parts = [f"<h2>{html.escape(title or 'When the model knows')} <small>{html.escape(diffmask.method)}, "
             f"{len(diffmask.texts)} text(s)</small></h2>",
             "<p>The slider picks a depth: each word is shaded by the probability that DiffMask keeps it "
             "there (input mode: a probe reading up to that layer; hidden mode: that layer's state). The grid "
             "under each text shows every layer at once.</p>",
             legend(True, any(o.rule != "max" for o in others), any(verdicts)),
             f"<p><input type='range' id='depth' min='0' max='{len(diffmask.columns) - 1}' step='1' "
             "style='width:20em'> <b id='depth-label'></b> <span id='depth-verdict'></span></p>"]
    for t, (text, words) in enumerate(zip(diffmask.texts, diffmask.words)):
        cells = "".join(f"<span class='w d' data-text='{t}' data-word='{j}'>{html.escape(word)}</span>"
                        for j, word in enumerate(words))
        rows = [_other_row(other, t) for other in others]
        parts.append(f"<h3>{html.escape(text)}</h3><table><tr><th>DiffMask, chosen layer</th><td>{cells}</td></tr>"
                     + "".join(f"<tr><th>{html.escape(r.label)}</th><td>{score_cells(r.cells, r.scores, r.probabilities)}"
                               "</td></tr>" for r in rows) + "</table>")
        parts.append(table("every layer", [Row(column, words, diffmask.word_scores[t][:, k].tolist(), True,
                                               verdicts[k]) for k, column in enumerate(diffmask.columns)]))
    script = json.dumps(data).replace("</", "<\\/")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title or 'When the model knows')}"
            f"</title><style>{STYLE}</style></head><body>{''.join(parts)}"
            f"<script type='application/json' id='depth-data'>{script}</script><script>{_SCRIPT}</script>"
            "</body></html>")


def _other_row(other: Explanation, text: int) -> Row:
    return Row(other.method, other.words[text], other.word_scores[text][:, 0].tolist(), other.rule == "max")


def _check(diffmask: Explanation, others: Sequence[Explanation]) -> None:
    if diffmask.rule != "max" or len(diffmask.columns) < 2:
        raise ValueError("diffmask must be keep probabilities at every layer: explain(dm, texts, tokenizer, "
                         f"layer=None); got {diffmask.method} with columns {diffmask.columns}")
    for other in others:
        if other.texts != diffmask.texts or other.words != diffmask.words:
            raise ValueError(f"others: {other.method} explains other texts or words than diffmask")
        if len(other.columns) != 1:
            raise ValueError(f"others: {other.method} has {len(other.columns)} columns; give one layer's scores")

