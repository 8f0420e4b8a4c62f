"""The sst-erasure suite's figure: a few scored sentences, each method's kept tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Sequence

import torch
from torch import Tensor

from benchmarks.tasks.sst import SSTData


def pick_sentences(data: SSTData, optimal_sets: Sequence[Tensor], count: int) -> List[int]:
    r"""Rows for the figure: sentences of 8..16 tokens with a unique optimal set of
    at least two tokens if there are some, spread over the scored set; else any."""
    lengths = data.lengths
    unique = torch.tensor([len(s) == 1 and int(s[0].sum()) >= 2 for s in optimal_sets])
    preferred = torch.nonzero(unique & (lengths >= 8) & (lengths <= 16)).flatten().tolist()
    others = [i for i in torch.nonzero((lengths >= 6) & (lengths <= 18)).flatten().tolist() if i not in preferred]
    pool = preferred + others if preferred or others else list(range(len(data)))
    if len(pool) <= count:
        return pool[:count]
    chosen = [pool[int(round(j * (len(pool) - 1) / max(count - 1, 1)))] for j in range(count)] if not preferred else []
    if preferred:
        step = max(len(preferred) // count, 1)
        chosen = preferred[::step][:count]
        chosen += [i for i in others if i not in chosen][: count - len(chosen)]
    return chosen


def kept_words_figure(
    sentences: Sequence[Sequence[str]], rows: Sequence[Mapping[str, Sequence[bool]]], titles: Sequence[str], path: Path
) -> None:
    r"""
    One panel per sentence, one line per method: the sentence's words, the kept
    ones on a green background, the erased ones grey (matplotlib, Agg canvas).

    Args:

        sentences (sequence): the words of each sentence.
        rows (sequence of dict): per sentence, ``{method: (T,) kept flags}`` in
                    display order (the first row is the reference).
        titles (sequence of str): a title per panel.
        path (Path): the PNG to write.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = sum(len(r) + 1.6 for r in rows)
    label_width = 0.09 * max(len(label) for r in rows for label in r) + 0.3
    width = max(8.0, label_width + 0.5 + 0.085 * max(sum(len(w) + 2 for w in s) for s in sentences))
    figure = Figure(figsize=(width, 0.3 * lines + 0.3))
    canvas = FigureCanvasAgg(figure)
    renderer = canvas.get_renderer()
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, width)  # data units = inches, so measured widths convert directly
    axes.set_ylim(lines, 0)
    axes.axis("off")
    to_data = axes.transData.inverted()
    y = 0.3
    for words, methods, title in zip(sentences, rows, titles):
        axes.text(0.1, y, title, fontsize=9.5, fontweight="bold", va="center", ha="left")
        y += 1.0
        for label, kept in methods.items():
            axes.text(label_width, y, label, fontsize=8.5, va="center", ha="right")
            x = label_width + 0.15
            for word, keep in zip(words, kept):
                text = axes.text(
                    x, y, word, fontsize=9, va="center", ha="left",
                    color="black" if keep else "#7a7a7a",
                    bbox=dict(boxstyle="round,pad=0.18", fc="#9be39b" if keep else "#f0f0f0", ec="none"),
                )
                extent = text.get_window_extent(renderer=renderer)
                x = float(to_data.transform((extent.x1, extent.y0))[0]) + 0.12
            y += 1.0
        y += 0.6
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=130, format="png")


def make_figure(
    data: SSTData, optimal_sets: Sequence[Tensor], kept_by_method: Mapping[str, Tensor], count: int, out_dir: Path
) -> Dict[str, str]:
    r"""The figure of a few scored sentences with each method's kept tokens."""
    picks = pick_sentences(data, optimal_sets, count)
    sentences, rows, titles = [], [], []
    for i in picks:
        n = int(data.lengths[i])
        words = data.token_text(i)  # word pieces, or words with -LRB- -> ( for reading
        solutions = optimal_sets[i]
        panel: Dict[str, Sequence[bool]] = {"exact erasure": solutions[0, :n].bool().tolist()}
        for name, kept in kept_by_method.items():
            panel[name] = kept[i, :n].bool().tolist()
        sentences.append(words)
        rows.append(panel)
        titles.append(f"gold label {data.sentences[i].label}; {len(solutions)} optimal set(s) of "
                      f"{int(solutions[0].sum())} token(s)" + ("; the first is shown" if len(solutions) > 1 else ""))
    path = out_dir / "figures" / "sst_kept_words.png"
    kept_words_figure(sentences, rows, titles, path)
    return {"file": f"figures/{path.name}", "caption": (
        "A few scored sentences: the tokens each method keeps (green) and erases (grey). The per-example masks "
        "(DiffMask, REINFORCE) show their own masks (the first seed's); the other methods their top-k tokens with "
        "k = the optimal size.")}
