"""The sst suite's figures: the layers a token is kept, by group, and the
per-layer heatmaps of a few sentences."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from captum_diffmask.interface.figures import layer_heatmaps, save_figure
from benchmarks.tasks.sst import LABEL_NAMES

from benchmarks.common.minilm.attributions import attribute_at
from benchmarks.common.minilm.loading import Bench
from benchmarks.suites.sst.settings import HEATMAP_METHODS


def groups_figure(groups: Mapping[str, Any], L: int, path: Path) -> str:
    r"""Bars of the layers a token is kept, by group (sentiment and, when there,
    part of speech), for both modes; returns the figure's path relative to the report."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    kinds = [k for k in ("sentiment", "pos") if k in groups["input"]]
    figure = Figure(figsize=(6.0 * len(kinds), 3.6))
    FigureCanvasAgg(figure)
    axes = np.atleast_1d(figure.subplots(1, len(kinds), squeeze=False)[0])
    for ax, kind in zip(axes, kinds):
        names = [g for g in groups["input"][kind] if groups["input"][kind][g]["tokens"] >= 20]
        if kind == "sentiment":
            names = [g for g in ["[CLS]", *LABEL_NAMES, "[SEP]"] if g in names]
        else:
            names = sorted(names, key=lambda g: -groups["input"][kind][g]["mean_layers"])
        x = np.arange(len(names))
        for offset, mode in ((-0.2, "input"), (0.2, "hidden")):
            values = [groups[mode][kind].get(g, {}).get("mean_layers", np.nan) for g in names]
            ax.bar(x + offset, values, width=0.4, label=f"DiffMask {mode}")
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(f"layers kept (of {L + 1})")
        ax.set_title(f"by {'word sentiment label' if kind == 'sentiment' else 'part of speech'}", fontsize=10)
        ax.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, path)
    return str(Path("figures") / path.name)


def heatmaps(
    config: Mapping[str, Any], bench: Bench, explainers: Mapping[str, Any], prepared: Mapping[str, Any],
    figures_dir: Path, notes: List[str],
) -> List[str]:
    r"""
    The per-layer heatmaps (tokens x layers) of a few evaluated sentences:
    DiffMask in each mode and the methods of :data:`HEATMAP_METHODS`.

    Args:

        config (Mapping): the suite's configuration (``heatmap_sentences``,
                    ``heatmap_max_tokens``).
        bench (Bench): the model, its tokenizer and the evaluated sentences.
        explainers (Mapping): DiffMask per mode (the first seed's).
        prepared (Mapping): the comparison methods that were set up.
        figures_dir (Path): where the PNGs go.
        notes (list of str): gets a note per method left out of a heatmap.

    Returns:
        *list* of the figures' paths, relative to the report.
    """
    data, layers = bench.evaluated, bench.layers
    lengths = data.attention_mask.sum(1)
    paths = []
    for n, row in enumerate(dict.fromkeys(_heatmap_rows(config, lengths))):
        T = int(lengths[row])
        ids, mask = data.input_ids[row : row + 1, :T], data.attention_mask[row : row + 1, :T]
        tokens = bench.tokenizer.convert_ids_to_tokens(ids[0])
        panels = _heatmap_panels(ids, mask, explainers, prepared, layers, notes)
        path = figures_dir / f"sst_heatmap_{n}.png"
        predicted = int(bench.model(input_ids=ids, attention_mask=mask).logits.argmax(-1))
        layer_heatmaps(tokens, panels, path, title=f"dev sentence {row}: gold {LABEL_NAMES[int(data.labels[row])]}, "
                                                    f"predicted {LABEL_NAMES[predicted]} (each layer normalised by its largest score)")
        paths.append(str(Path("figures") / path.name))
    return paths


def _heatmap_rows(config: Mapping[str, Any], lengths: Tensor) -> List[int]:
    r"""``heatmap_sentences`` rows spread over the sentences of 6 to
    ``heatmap_max_tokens`` tokens (a row may repeat when there are few)."""
    count = int(config.get("heatmap_sentences", 0))
    longest = int(config.get("heatmap_max_tokens", 16))
    candidates = torch.nonzero((lengths >= 6) & (lengths <= longest)).flatten().tolist()
    return [candidates[int(i)] for i in np.linspace(0, len(candidates) - 1, count).round()] if candidates and count else []


def _heatmap_panels(
    ids: Tensor, mask: Tensor, explainers: Mapping[str, Any], prepared: Mapping[str, Any], layers: int, notes: List[str]
) -> Dict[str, Tuple[Any, Optional[Sequence[str]]]]:
    r"""One sentence's panels: per method, its (T, columns) scores and the
    columns' labels (E = the embeddings, then the layers)."""
    labels = ["E"] + [str(k) for k in range(1, layers + 1)]
    panels: Dict[str, Tuple[Any, Optional[Sequence[str]]]] = {}
    for mode in ("input", "hidden"):
        if mode in explainers:
            panels[f"DiffMask {mode}"] = (explainers[mode].attribute(ids, additional_forward_args=(mask,), layer=None)[0], labels)
    for name in HEATMAP_METHODS:
        method = prepared.get(name)
        if method is None:
            continue
        if method.explainer.attributes_every_layer():  # one call, one column per block (attention)
            every = method.attribute(ids, (mask,), None)[0]
            panels[name] = (every, labels if every.shape[-1] == len(labels) else labels[1:])
            continue
        try:
            columns = [attribute_at(method, ids, mask, k)[0] for k in range(layers + 1)]
        except Exception as error:  # noqa: BLE001
            notes.append(f"Heatmap of {name} skipped: {type(error).__name__}: {error}")
            continue
        panels[name] = (torch.stack(columns, -1), labels)
    return panels
