"""The suite's figure: comprehensiveness and sufficiency against the top-k
fraction, one line per method."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from matplotlib.figure import Figure

from captum_diffmask.interface.figures import save_figure


def shown(names: Sequence[str]) -> list:
    r"""The score sets drawn: every method, and of DiffMask's only the mean over
    layers and the last layer (the others are in the tables)."""
    layers = sorted((n for n in names if n.startswith("DiffMask layer ")), key=lambda n: int(n.rsplit(" ", 1)[1]))
    return [n for n in names if not n.startswith("DiffMask layer ")] + layers[-1:]


def curves_figure(metrics: Mapping[str, Mapping[str, Any]], fractions: Sequence[float], removal: str, path: Path) -> str:
    r"""Draws comprehensiveness (higher is better) and sufficiency (lower is
    better) against the top-k fraction for ``removal``; returns the path
    relative to the report (``figures/NAME``)."""
    figure = Figure(figsize=(10, 4))
    axes = figure.subplots(1, 2)
    x = [100 * f for f in fractions]
    for name in shown(list(metrics[removal])):
        record = metrics[removal][name]
        for ax, key in zip(axes, ("comprehensiveness", "sufficiency")):
            ax.plot(x, record[key], marker="o", label=name)
    for ax, key, better in zip(axes, ("comprehensiveness", "sufficiency"), ("higher", "lower")):
        ax.set_xscale("log")
        ax.set_xlabel("top-k, % of the words")
        ax.set_ylabel(f"{key} ({better} is better)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    figure.suptitle(f"Tokens removed by {removal}")
    figure.tight_layout()
    save_figure(figure, path)
    return f"figures/{path.name}"
