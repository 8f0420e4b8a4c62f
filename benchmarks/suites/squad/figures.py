"""The squad suite's figures: the keep per layer of each token group (the
paper's Figure 5), the masked model's answers per layer, the layers kept by
part of speech (its appendix figure), per-example heatmaps and the methods side
by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from captum_diffmask.interface.figures import attribution_panels, layer_heatmaps, save_figure

from benchmarks.suites.squad.analysis import GROUPS
from benchmarks.suites.squad.loading import Bench
from benchmarks.suites.squad.side_by_side import crop

MODES = ("input", "hidden")


def _relative(path: Path) -> str:
    return str(Path("figures") / path.name)


def keep_figure(keep: Mapping[str, Any], agreement: Mapping[str, List[Mapping[str, Any]]], path: Path) -> str:
    r"""Per mode, the mean keep probability of each token group at every layer,
    and the masked share and same-answer rate of the masked model per layer."""
    figure = Figure(figsize=(13.0, 3.8))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3)
    for ax, mode in zip(axes, MODES):
        for group in GROUPS:
            if group in keep[mode]:
                values = keep[mode][group]["keep"]
                ax.plot(range(len(values)), values, marker="o", markersize=3, label=group)
        ax.set_title(f"DiffMask {mode}: mean keep probability", fontsize=10)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("%")
        ax.set_ylim(-2, 102)
        ax.legend(fontsize=7)
    for mode, style in zip(MODES, ("-", "--")):
        rows = agreement[mode]
        layers = [r["layer"] for r in rows]
        axes[2].plot(layers, [r["masked_share"] for r in rows], style, color="tab:red", label=f"{mode}: masked %")
        axes[2].plot(layers, [r["same_exact_match"] for r in rows], style, color="tab:green", label=f"{mode}: same answer %")
    axes[2].set_title("the model under the deterministic gates", fontsize=10)
    axes[2].set_xlabel("layer")
    axes[2].set_ylim(-2, 102)
    axes[2].legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path)
    return _relative(path)


def pos_figure(pos: Mapping[str, Any], layers: int, path: Path, min_tokens: int) -> str:
    r"""Bars of the expected layers kept by part of speech (question, context,
    all), both modes; parts of speech with fewer than ``min_tokens`` tokens left out."""
    figure = Figure(figsize=(15.0, 3.8))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3)
    for ax, segment in zip(axes, ("question", "context", "all")):
        prefix = f"{segment}:"
        names = [n for n, v in pos["input"].items() if n.startswith(prefix) and v["tokens"] >= min_tokens]
        names.sort(key=lambda n: pos["input"][n]["mean_layers"])
        x = np.arange(len(names))
        for offset, mode in ((-0.2, "input"), (0.2, "hidden")):
            ax.bar(x + offset, [pos[mode].get(n, {}).get("mean_layers", np.nan) for n in names], width=0.4,
                   label=f"DiffMask {mode}")
        ax.set_xticks(x)
        ax.set_xticklabels([n[len(prefix):] for n in names], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(f"layers kept (of {layers + 1})")
        ax.set_title(f"{segment} tokens, by part of speech", fontsize=10)
        ax.legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path)
    return _relative(path)


def heatmap_figures(bench: Bench, rows: Sequence[int], keep: Mapping[str, List[Tensor]], width: int,
                    figures_dir: Path) -> List[str]:
    r"""Per example, a tokens x layers heatmap of DiffMask's keep probabilities
    in each mode (as given, not normalised), on the window's crop (:func:`crop`)."""
    paths = []
    labels = ["E"] + [str(k) for k in range(1, bench.layers + 1)]
    for n, row in enumerate(rows):
        shown = crop(bench, row, width)
        tokens = _tokens(bench, row, shown)
        for mode in MODES:
            path = figures_dir / f"squad_heatmap_{n}_{mode}.png"
            layer_heatmaps(tokens, {f"DiffMask {mode}": (keep[mode][row][shown], labels)}, path, per_layer=False,
                           title=_title(bench, row, "keep probability per layer (gold answer marked *)"), dpi=100)
            paths.append(_relative(path))
    return paths


def side_by_side_figures(bench: Bench, rows: Sequence[int], scores: Mapping[str, Tensor], width: int,
                         figures_dir: Path) -> List[str]:
    r"""Per example, one row per method of the input attributions on the
    window's crop, each row scaled to [0, 1]; the gold answer highlighted."""
    paths = []
    for n, row in enumerate(rows):
        shown = crop(bench, row, width)
        panel = {name: value[n][shown] for name, value in scores.items()}
        gold = _gold(bench, row)
        path = figures_dir / f"squad_methods_{n}.png"
        attribution_panels(_tokens(bench, row, shown, mark=False), [("input attributions", panel)], path,
                           title=_title(bench, row, "each row scaled to [0, 1]; gold answer in red"),
                           highlight=[t in gold for t in shown], annotate=False, dpi=100)
        paths.append(_relative(path))
    return paths


def _gold(bench: Bench, row: int) -> range:
    start, end = int(bench.windows.start_positions[row]), int(bench.windows.end_positions[row])
    return range(start, end + 1) if start > 0 else range(0)


def _tokens(bench: Bench, row: int, shown: Sequence[int], mark: bool = True) -> List[str]:
    tokens = bench.tokenizer.convert_ids_to_tokens(bench.windows.input_ids[row].tolist())
    gold = _gold(bench, row)
    return [f"*{tokens[t]}" if mark and t in gold else tokens[t] for t in shown]


def _title(bench: Bench, row: int, what: str) -> str:
    q = int(bench.windows.example_index[row])
    example = bench.held_out[q]
    return f"{example.question!r} gold {example.answers[0]!r}, predicted {bench.answers[q]!r}: {what}"

