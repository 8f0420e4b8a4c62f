r"""The components suite's figures: per input, a heatmap of blocks x components
(P(kept), or the attribution patching score scaled to its largest), one row of
panels per method, beside the program's own use of its components."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Sequence

import numpy as np

#: The methods whose scores are not P(kept) (scaled to each input's largest; the masks' are drawn as they are).
SCALED = ("attribution patching",)


def _scaled(scores: np.ndarray) -> np.ndarray:
    r"""|scores| divided by the input's largest."""
    top = np.abs(scores).max()
    return np.abs(scores) / top if top > 0 else np.abs(scores)


def components_figure(rows: Mapping[str, Sequence[Any]], titles: Sequence[str], path: Path,
                      truth: Any = None, xlabel: str = "component") -> str:
    r"""
    One panel per input (columns) and method (rows), each blocks x components:
    P(kept) for the masks, |score| over the input's largest for the
    others (:data:`SCALED`).

    Args:

        rows (mapping): method -> per input (blocks, count) scores.
        titles (sequence of str): a title per input (column).
        path (Path): where the PNG goes.
        truth (array, optional): (blocks, count) 0/1, drawn as a first column.
                    Default: None
        xlabel (str, optional): the components' axis. Default: ``"component"``

    Returns:
        *str* the file's name (the report links it relative to its folder).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = len(titles) + (truth is not None)
    figure = Figure(figsize=(2.6 * columns, 1.9 * len(rows) + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(rows), columns, squeeze=False)
    image = None
    for r, (method, panels) in enumerate(rows.items()):
        column = 0
        if truth is not None:
            image = axes[r][0].imshow(np.asarray(truth, dtype=float), vmin=0, vmax=1, cmap="Greys", aspect="auto")
            axes[r][0].set_title("used by the program (black)", fontsize=7)
            column = 1
        for c, panel in enumerate(panels):
            ax = axes[r][column + c]
            panel = np.asarray(panel, dtype=float)
            image = ax.imshow(_scaled(panel) if method in SCALED else panel, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.set_title(titles[c], fontsize=7)
        axes[r][0].set_ylabel(f"{method}\nblock", fontsize=8)
    blocks = np.asarray(next(iter(rows.values()))[0]).shape[0]
    for ax in np.asarray(axes).reshape(-1):
        ax.tick_params(labelsize=6)
        ax.set_yticks(range(blocks), [str(k) for k in range(1, blocks + 1)])
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel, fontsize=7)
    if image is not None:
        figure.colorbar(image, ax=list(np.asarray(axes).reshape(-1)), shrink=0.8, label="P(kept) / scaled score")
    figure.savefig(path, dpi=110)
    return path.name


def _title(tokens: List[str], limit: int = 36) -> str:
    text = " ".join(tokens)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tracr_figures(figures: Sequence[Mapping[str, Any]], folder: Path) -> List[str]:
    r"""A figure per program and kind (:func:`components_figure`); their file names."""
    names = []
    for figure in figures:
        titles = [_title(tokens) for tokens in figure["tokens"]]
        for kind, data in figure["kinds"].items():
            # block k of the truth is row k - 1 of the (L, count) matrix, as the scores'
            path = folder / f"components-{figure['program']}-{kind}.png"
            names.append(components_figure(data["methods"], titles, path, truth=data["used"],
                                           xlabel="head" if kind == "heads" else "MLP unit"))
    return names


def sst_figure(figure: Mapping[str, Any], folder: Path) -> str:
    r"""The SST sentences' heads x layers, per method; the file's name."""
    titles = [_title(tokens) for tokens in figure["tokens"]]
    return components_figure(figure["methods"], titles, folder / "components-sst-heads.png", xlabel="head")
