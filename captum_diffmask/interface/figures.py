"""Figures of attributions (matplotlib, written as PNG).

Every function builds a :class:`matplotlib.figure.Figure` on the Agg canvas
directly, without ``pyplot``: nothing here changes the caller's matplotlib backend
or global state, and it works on machines without a display. Each returns the
figure and, given ``path``, also saves it there.

- :func:`attribution_panels`: one sequence, one row per method (or layer), each
  row normalised to [0, 1] so that methods with different scales compare (the
  paper's toy-task figure);
- :func:`layer_heatmap`: one sequence, tokens x layers (DiffMask's per-layer view);
- :func:`layer_heatmaps`: one sequence, a tokens x layers heatmap per method, each
  normalised per layer (the paper's comparison of methods on hidden states);
- :func:`hidden_state_scatter`: 2-D hidden states coloured by a category (the
  paper's appendix figure of the toy model's FFNN output).
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["save_figure", "normalize_unit", "normalize_per_layer", "attribution_panels", "layer_heatmap", "layer_heatmaps", "hidden_state_scatter"]

PathLike = Union[str, "os.PathLike[str]"]
Panel = Tuple[str, Mapping[str, Any]]


def _as_array(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().float().numpy()
    return np.asarray(values, dtype=float)


def normalize_unit(scores: Any) -> np.ndarray:
    r"""
    Scores scaled to [0, 1] by their maximum, as the paper does "to enable
    comparison across methods".

    Negative scores are clipped to 0 first (attributions here mean importance);
    an all-zero (or all-negative) row stays all zero; non-finite entries become 0.

    Args:

        scores (array-like): (T,) or (N, T) scores; rows are scaled separately.

    Returns:
        *ndarray* of the same shape, float, in [0, 1].
    """
    array = _as_array(scores)
    array = np.where(np.isfinite(array), array, 0.0).clip(min=0.0)
    peak = array.max(axis=-1, keepdims=True) if array.size else array
    return np.divide(array, peak, out=np.zeros_like(array), where=peak > 0)


def save_figure(figure: Figure, path: Optional[PathLike], dpi: int = 150) -> Figure:
    r"""
    Writes ``figure`` as a PNG at ``path`` (its folder created), unless ``path``
    is None.

    Args:

        figure (Figure): a figure built by this module (or any matplotlib figure).
        path (str or PathLike, optional): the file to write; nothing is written
                    when None.
        dpi (int, optional): resolution. Default: 150

    Returns:
        *Figure*: ``figure`` itself.
    """
    if path is not None:
        directory = os.path.dirname(os.fspath(path))
        if directory:
            os.makedirs(directory, exist_ok=True)
        figure.savefig(path, dpi=dpi, bbox_inches="tight", format="png")
    return figure


def attribution_panels(
    tokens: Sequence[str],
    panels: Sequence[Panel],
    path: Optional[PathLike] = None,
    title: Optional[str] = None,
    highlight: Optional[Sequence[bool]] = None,
    annotate: bool = True,
    normalize: bool = True,
    dpi: int = 150,
) -> Figure:
    r"""
    Heatmaps of one sequence's attributions: one panel per group of rows, one row
    per method, one column per token.

    Args:

        tokens (sequence of str): the T tokens shown (the real ones; trim padding
                    first).
        panels (sequence): ``(panel title, {row label: scores (T,)})`` pairs; e.g.
                    one panel for hidden-state attributions and one for input
                    attributions.
        path (str or PathLike, optional): where to save the PNG. Default: None
        title (str, optional): the figure title. Default: None
        highlight (sequence of bool, optional): (T,) tokens to mark (e.g. the
                    ground truth): their labels are drawn bold and red.
                    Default: None
        annotate (bool, optional): print each cell's value. Default: True
        normalize (bool, optional): scale each row to [0, 1] with
                    :func:`normalize_unit`; else the scores are drawn as given on
                    a [0, 1] colour scale. Default: True

    Returns:
        *Figure*.
    """
    tokens = [str(t) for t in tokens]
    if highlight is not None and len(highlight) != len(tokens):
        raise ValueError(f"highlight must have one entry per token ({len(tokens)}), got {len(highlight)}")
    prepared = _panel_matrices(len(tokens), panels, normalize)
    heights = [len(labels) for _, labels, _ in prepared]
    width = max(4.0, 0.55 * len(tokens) + 3.2)
    figure = Figure(figsize=(width, 0.42 * sum(heights) + 0.9 * len(prepared) + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(prepared), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    image = None
    for ax, (panel_title, labels, matrix) in zip(axes, prepared):
        image = ax.imshow(matrix, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xticks(range(len(tokens)))
        ax.set_xticklabels(tokens, fontsize=9)
        ax.set_title(panel_title, fontsize=9, loc="left")
        ax.tick_params(length=0)
        if highlight is not None:
            for label, marked in zip(ax.get_xticklabels(), highlight):
                if marked:
                    label.set_color("tab:red")
                    label.set_fontweight("bold")
        if annotate:
            for (i, j), value in np.ndenumerate(matrix):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if value > 0.6 else "black")
    if image is not None:
        figure.colorbar(image, ax=list(axes), shrink=0.8, label="normalised attribution" if normalize else "attribution")
    if title:
        figure.suptitle(title, fontsize=10)
    return save_figure(figure, path, dpi)


def _panel_matrices(
    num_tokens: int, panels: Sequence[Panel], normalize: bool
) -> List[Tuple[str, List[str], np.ndarray]]:
    r"""Each panel's title, row labels and (rows, T) matrix in [0, 1]; errors
    name ``panels``."""
    if not panels:
        raise ValueError("panels must hold at least one (title, rows) pair")
    prepared = []
    for panel_title, rows in panels:
        if not rows:
            raise ValueError(f"panels: panel {panel_title!r} has no rows")
        labels, values = [], []
        for label, scores in rows.items():
            array = _as_array(scores).reshape(-1)
            if array.shape[0] != num_tokens:
                raise ValueError(
                    f"panels: row {label!r} of {panel_title!r} has {array.shape[0]} scores for {num_tokens} tokens"
                )
            labels.append(str(label))
            values.append(normalize_unit(array) if normalize else np.clip(np.nan_to_num(array), 0.0, 1.0))
        prepared.append((panel_title, labels, np.stack(values)))
    return prepared


def normalize_per_layer(scores: Any) -> np.ndarray:
    r"""
    (T, L) scores with each layer (column) divided by its largest absolute value,
    as the paper's per-layer figures ("normalized per-layer by the largest
    attribution"); an all-zero column stays 0.

    Args:

        scores (array-like): (T, L).

    Returns:
        *ndarray* (T, L) in [-1, 1].
    """
    matrix = np.nan_to_num(_as_array(scores))
    if matrix.ndim != 2:
        raise ValueError(f"scores must have shape (T, L), got {tuple(matrix.shape)}")
    largest = np.abs(matrix).max(axis=0, keepdims=True)
    return np.divide(matrix, largest, out=np.zeros_like(matrix), where=largest > 0)


def layer_heatmap(
    tokens: Sequence[str],
    scores: Any,
    path: Optional[PathLike] = None,
    title: Optional[str] = None,
    layer_labels: Optional[Sequence[str]] = None,
    dpi: int = 150,
) -> Figure:
    r"""
    One sequence's attributions at every layer: rows are layers (0 at the bottom,
    as depth grows upwards), columns are tokens; values drawn on [0, 1] as given
    (DiffMask's keep probabilities are already there).

    Args:

        tokens (sequence of str): the T tokens.
        scores (array-like): (T, L + 1), e.g. ``DiffMask.attribute(..., layer=None)[i]``.
        path (str or PathLike, optional): where to save the PNG. Default: None
        title (str, optional): Default: None
        layer_labels (sequence of str, optional): L + 1 row labels; "layer k" when
                    None. Default: None

    Returns:
        *Figure*.
    """
    return layer_heatmaps(tokens, {title or "": (scores, layer_labels)}, path, per_layer=False, dpi=dpi)


def layer_heatmaps(
    tokens: Sequence[str],
    panels: Mapping[str, Tuple[Any, Optional[Sequence[str]]]],
    path: Optional[PathLike] = None,
    per_layer: bool = True,
    title: Optional[str] = None,
    dpi: int = 150,
) -> Figure:
    r"""
    One sequence, several methods: a tokens x layers heatmap per method, side by
    side (the paper's comparison figures). Rows are layers (0 at the bottom).

    Args:

        tokens (sequence of str): the T tokens.
        panels (mapping): panel title -> ``(scores, layer_labels)``, scores
                    (T, L_p) (each panel may have its own number of layers),
                    layer_labels L_p row labels or None ("layer k").
        path (str or PathLike, optional): where to save the PNG. Default: None
        per_layer (bool, optional): divide each layer by its largest absolute
                    score (:func:`normalize_per_layer`) and draw |.|; False draws
                    the scores as given, clipped to [0, 1]. Default: True
        title (str, optional): the figure's title. Default: None
        dpi (int, optional): Default: 150

    Returns:
        *Figure*.
    """
    tokens = [str(t) for t in tokens]
    if not panels:
        raise ValueError("panels must not be empty")
    matrices, labels = [], []
    for name, (scores, layer_labels) in panels.items():
        matrix = _as_array(scores)
        if matrix.ndim != 2 or matrix.shape[0] != len(tokens):
            raise ValueError(f"scores of {name!r} must have shape ({len(tokens)}, L), got {tuple(matrix.shape)}")
        rows = list(layer_labels) if layer_labels is not None else [f"layer {k}" for k in range(matrix.shape[1])]
        if len(rows) != matrix.shape[1]:
            raise ValueError(f"layer_labels of {name!r} must have {matrix.shape[1]} entries, got {len(rows)}")
        matrices.append(np.abs(normalize_per_layer(matrix)) if per_layer else np.clip(np.nan_to_num(matrix), 0.0, 1.0))
        labels.append(rows)
    layers = max(m.shape[1] for m in matrices)
    width = max(4.0, 0.42 * len(tokens) + 1.8)
    figure = Figure(figsize=(width * len(matrices), 0.4 * layers + 1.6 + (0.3 if title else 0.0)))
    FigureCanvasAgg(figure)
    axes = np.atleast_1d(figure.subplots(1, len(matrices), squeeze=False)[0])
    rotate = 45 if max(map(len, tokens), default=1) > 3 else 0
    for ax, name, matrix, rows in zip(axes, panels, matrices, labels):
        image = ax.imshow(matrix.T, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
        ax.set_xticks(range(len(tokens)))
        ax.set_xticklabels(tokens, fontsize=8, rotation=rotate)
        ax.set_yticks(range(matrix.shape[1]))
        ax.set_yticklabels(rows, fontsize=8)
        if name:
            ax.set_title(name, fontsize=10)
    figure.colorbar(image, ax=list(axes), pad=0.01, fraction=0.02 if len(matrices) > 1 else 0.05)
    if title:
        figure.suptitle(title, fontsize=11)
    return save_figure(figure, path, dpi)


def hidden_state_scatter(
    states: Any,
    categories: Sequence[str],
    path: Optional[PathLike] = None,
    title: Optional[str] = None,
    order: Optional[Sequence[str]] = None,
    max_points: Optional[int] = 5000,
    seed: int = 0,
    dpi: int = 150,
) -> Figure:
    r"""
    A scatter plot of 2-D hidden states coloured by category, e.g. the toy
    model's FFNN outputs by whether the digit is ``= n``, ``= m`` or neither.

    Args:

        states (array-like): (N, 2) states.
        categories (sequence of str): (N,) the category of each state.
        path (str or PathLike, optional): where to save the PNG. Default: None
        title (str, optional): Default: None
        order (sequence of str, optional): the legend order (and which
                    categories are drawn last, on top); sorted when None.
                    Default: None
        max_points (int, optional): draw at most this many points, a seeded
                    random subset (all when None). Default: 5000
        seed (int, optional): seed of that subset. Default: 0

    Returns:
        *Figure*.
    """
    points = _as_array(states)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"states must have shape (N, 2), got {tuple(points.shape)}")
    labels = np.asarray([str(c) for c in categories])
    if labels.shape[0] != points.shape[0]:
        raise ValueError(f"categories must have one entry per state ({points.shape[0]}), got {labels.shape[0]}")
    if max_points is not None and points.shape[0] > max_points:
        keep = np.random.default_rng(seed).choice(points.shape[0], size=max_points, replace=False)
        points, labels = points[keep], labels[keep]
    names = list(order) if order is not None else sorted(set(labels.tolist()))
    figure = Figure(figsize=(4.8, 4.2))
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    for index, name in enumerate(names):
        chosen = labels == name
        if chosen.any():
            ax.scatter(points[chosen, 0], points[chosen, 1], s=9, alpha=0.6,
                       marker=markers[index % len(markers)], label=f"{name} ({int(chosen.sum())})")
    ax.set_xlabel("dimension 1")
    ax.set_ylabel("dimension 2")
    ax.legend(fontsize=8, markerscale=1.5)
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(figure, path, dpi)
