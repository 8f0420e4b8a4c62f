"""What :func:`~captum_diffmask.interface.generation.attribute_generation` returns:
the attributions of each generated token to its sources, as matrices, word
scores, a figure and an HTML page."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from captum_diffmask.interface.figures import PathLike, save_figure
from captum_diffmask.interface.html import GREEN, legend, RED, STYLE, verdict_cell
from captum_diffmask.model.texts import merge_into_words, word_rule

__all__ = ["GenerationAttribution"]


@dataclass
class GenerationAttribution:
    r"""
    The attributions of a generation: step t (the t-th generated token) against
    every source token before it.

    Attributes:

        ids (Tensor): (S + N,) the S prompt ids, then the N generated ids.
        prompt_length (int): S.
        scores (Tensor): (N, S + N - 1), or (N, S + N - 1, L + 1) when the method
                    attributed every layer (DiffMask with ``layer=None``): row t
                    scores the sources ``0 .. S + t - 1``; later sources are 0.
        defined (Tensor): (N, S + N - 1) bool, True where the source precedes
                    the step (``j < S + t``).
        tokens (list of str): the S + N tokens as text (the ids when no tokenizer
                    was given).
        method (str): the method's name.
        layers (list of int or None): the layers of the last axis of ``scores``;
                    None when ``scores`` is 2-D (``layer`` is then the one layer).
        layer (int or None): the layer attributed when ``scores`` is 2-D.
        word_ids (list of int or None, optional): the word of each of the
                    S + N - 1 sources (:func:`~captum_diffmask.model.texts.decoded_words`:
                    whitespace-delimited; None for special tokens), when a
                    tokenizer was given.
        words (list of str, optional): the W source words' text.
        probabilities (bool): the scores are keep probabilities (pieces merge
                    into a word by their largest score, else by their sum:
                    :func:`~captum_diffmask.model.texts.word_rule`), drawn on 0..1.
        encoder_decoder (bool): the model was an encoder-decoder: the prompt is
                    its encoder's input, the only sources (S columns, every one
                    defined at every step); the generated tokens are its decoder's.
        verdicts (dict): layer -> the convergence status of the method's probe
                    there (:func:`~captum_diffmask.interface.verdicts.layer_verdict`);
                    empty for a method without a fit of its own.
    """

    ids: Tensor
    prompt_length: int
    scores: Tensor
    defined: Tensor
    tokens: List[str]
    method: str
    layers: Optional[List[int]] = None
    layer: Optional[int] = None
    word_ids: Optional[List[Optional[int]]] = None
    words: Optional[List[str]] = None
    probabilities: bool = False
    encoder_decoder: bool = False
    verdicts: Dict[int, str] = field(default_factory=dict)

    @property
    def generated_ids(self) -> Tensor:
        r"""(N,) the generated ids."""
        return self.ids[self.prompt_length:]

    @property
    def source_tokens(self) -> List[str]:
        r"""The source tokens: S + N - 1 (every token but the last generated one),
        or an encoder-decoder's S."""
        return self.tokens[:self.prompt_length] if self.encoder_decoder else self.tokens[:-1]

    @property
    def step_tokens(self) -> List[str]:
        r"""The N generated tokens, one per step."""
        return self.tokens[self.prompt_length:]

    @property
    def word_scores(self) -> Tensor:
        r"""(N, W) or (N, W, L + 1): each step's scores merged into the source
        words (:attr:`words`) by the rule for what they are."""
        word_ids = self._word_ids()
        merged = merge_into_words(self.scores.float().transpose(0, 1), word_ids, word_rule(self.probabilities))
        return merged.transpose(0, 1)

    @property
    def word_defined(self) -> Tensor:
        r"""(N, W) bool, True where some piece of the word precedes the step."""
        return merge_into_words(self.defined.float().transpose(0, 1), self._word_ids(), "max").transpose(0, 1) > 0

    @property
    def word_in_prompt(self) -> List[bool]:
        r"""For each source word, whether it starts in the prompt."""
        word_ids = self._word_ids()
        return [min(j for j, w in enumerate(word_ids) if w == word) < self.prompt_length
                for word in sorted({w for w in word_ids if w is not None})]

    def to_captum(self, layer: Optional[int] = None) -> Any:
        r"""
        The attributions as Captum's ``LLMAttributionResult``, whose
        ``plot_token_attr`` and ``plot_seq_attr`` draw them: its input tokens are
        the source tokens (:attr:`source_tokens`), its output tokens the
        generated ones; ``token_attr`` is :attr:`scores` with the sources after
        each step 0, ``seq_attr`` their sum over the steps (their largest for
        keep probabilities, which do not add up).

        Args:

            layer (int, optional): the layer shown when :attr:`scores` holds every
                        layer (one of :attr:`layers`; None: the last). Default: None

        Returns:
            *captum.attr.LLMAttributionResult*: ``token_attr`` (N, S + N - 1)
            (an encoder-decoder's (N, S)), ``seq_attr`` (S + N - 1,).
        """
        from captum.attr import LLMAttributionResult

        scores = self.scores.float()
        if scores.dim() == 3:
            assert self.layers is not None
            chosen = self.layers[-1] if layer is None else layer
            if chosen not in self.layers:
                raise ValueError(f"layer must be one of {self.layers}, got {layer}")
            scores = scores[..., self.layers.index(chosen)]
        elif layer is not None and layer != self.layer:
            raise ValueError(f"layer: this generation holds layer {self.layer} alone, got {layer}")
        token_attr = scores * self.defined.float()
        seq_attr = token_attr.max(0).values if self.probabilities else token_attr.sum(0)
        return LLMAttributionResult(input_tokens=list(self.source_tokens), output_tokens=list(self.step_tokens),
                                    seq_attr=seq_attr, token_attr=token_attr)

    def _word_ids(self) -> List[Optional[int]]:
        if self.word_ids is None:
            raise ValueError("this generation has no words: give attribute_generation tokenizer=")
        return self.word_ids

    def _by_word(self, words: Optional[bool]) -> bool:
        if words and self.word_ids is None:
            raise ValueError("words=True: this generation has no words (give attribute_generation tokenizer=)")
        return self.word_ids is not None if words is None else words

    def matrices(self, words: Optional[bool] = None) -> List[Tuple[str, np.ndarray]]:
        r"""
        ``(title, array)`` per layer, undefined cells NaN (for drawing).

        Args:

            words (bool, optional): columns are source words (:attr:`words`) or
                        source tokens; None: words where there are some. Default: None

        Returns:
            *list* of ``(title, (N, W) or (N, S + N - 1) array)``.
        """
        by_word = self._by_word(words)
        scores = (self.word_scores if by_word else self.scores).float().numpy()
        undefined = ~(self.word_defined if by_word else self.defined).numpy()
        if scores.ndim == 2:
            scores = scores[..., None]
        labels = [f"layer {k}" for k in self.layers] if self.layers is not None else [f"layer {self.layer}"]
        out = []
        for index, label in enumerate(labels):
            matrix = scores[..., index].copy()
            matrix[undefined] = np.nan
            out.append((f"{self.method}, {label}", matrix))
        return out

    def _columns(self, by_word: bool) -> Tuple[List[str], List[bool]]:
        r"""The column labels and whether each is in the prompt."""
        if by_word:
            assert self.words is not None
            return list(self.words), self.word_in_prompt
        return self.source_tokens, [j < self.prompt_length for j in range(len(self.source_tokens))]

    def plot(self, path: Optional[PathLike] = None, dpi: int = 120, words: Optional[bool] = None) -> Figure:
        r"""
        Steps x sources heatmaps, one panel per layer; keep probabilities on
        0..1, other scores on the panel's own range, the prompt's end marked by
        a line.

        Args:

            path (str or Path, optional): where to save the PNG. Default: None
            dpi (int, optional): its resolution. Default: 120
            words (bool, optional): columns are words or tokens, as in
                        :meth:`matrices`. Default: None

        Returns:
            *Figure* (saved as PNG at ``path`` when given).
        """
        by_word = self._by_word(words)
        panels = self.matrices(by_word)
        labels, in_prompt = self._columns(by_word)
        sources, steps = len(labels), len(self.step_tokens)
        width, height = max(4.0, 0.35 * sources + 2.0), max(1.6, 0.3 * steps + 1.2)
        figure = Figure(figsize=(width, height * len(panels)))
        FigureCanvasAgg(figure)
        for index, (title, matrix) in enumerate(panels):
            axes = figure.add_subplot(len(panels), 1, index + 1)
            image = axes.imshow(np.ma.masked_invalid(matrix), aspect="auto", cmap="viridis",
                                vmin=0.0 if self.probabilities else None, vmax=1.0 if self.probabilities else None)
            axes.axvline(sum(in_prompt) - 0.5, color="white", linewidth=1.0)
            axes.set_title(title, fontsize=9)
            axes.set_xticks(range(sources))
            axes.set_xticklabels(labels, rotation=90, fontsize=7)
            axes.set_yticks(range(steps))
            axes.set_yticklabels(self.step_tokens, fontsize=7)
            axes.set_xlabel("source token")
            axes.set_ylabel("generated token")
            figure.colorbar(image, ax=axes, fraction=0.03)
        figure.tight_layout()
        return save_figure(figure, path, dpi=dpi)

    def to_html(self, path: Optional[PathLike] = None, words: Optional[bool] = None) -> str:
        r"""
        A self-contained HTML page (inline styles, no script, no external file):
        a legend, then per layer (with its probe's convergence verdict, where it
        has one) a table of steps x sources whose cells are shaded by the score
        (keep probabilities on their absolute 0..1 scale, other scores over the
        row's largest magnitude) and hold it in their tooltip.

        Args:

            path (str or Path, optional): where to write the page. Default: None
            words (bool, optional): columns are words or tokens, as in
                        :meth:`matrices`. Default: None

        Returns:
            *str*: the page (also written to ``path`` when given).
        """
        by_word = self._by_word(words)
        title = html.escape(f"{self.method}: attributions of {len(self.step_tokens)} generated tokens")
        parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title>"
                 f"<style>{STYLE}</style></head>", "<body>", f"<h2>{title}</h2>",
                 f"<p>Rows: generated tokens, in order. Columns: {self._columns_are(by_word)}; "
                 "a blank cell comes after its step.</p>",
                 legend(self.probabilities, not self.probabilities, bool(self.verdicts))]
        labels, in_prompt = self._columns(by_word)
        layers = self.layers if self.layers is not None else [self.layer]
        for layer, (label, matrix) in zip(layers, self.matrices(by_word)):
            verdict = self.verdicts.get(layer, "") if layer is not None else ""
            parts.append(f"<h3>{html.escape(label)} {verdict_cell(verdict) if verdict else ''}</h3>")
            parts.append(self._html_table(matrix, labels, in_prompt))
        parts.append("</body></html>\n")
        page = "\n".join(parts)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
        return page

    def _columns_are(self, by_word: bool) -> str:
        unit = "words" if by_word else "tokens"
        if self.encoder_decoder:
            return f"the {unit} of the encoder's input (the decoder's own tokens are given, not attributed)"
        return f"the prompt (bold) and the {unit} generated before"

    def _html_table(self, matrix: np.ndarray, labels: Sequence[str], in_prompt: Sequence[bool]) -> str:
        head = "".join(
            f"<th style='padding:2px 4px;{'font-weight:bold' if prompt else 'font-weight:normal'}'>"
            f"{html.escape(label)}</th>" for label, prompt in zip(labels, in_prompt))
        rows = [f"<tr><th></th>{head}</tr>"]
        for step, token in enumerate(self.step_tokens):
            values = matrix[step]
            scale = 1.0 if self.probabilities else np.nanmax(np.abs(values)) if np.isfinite(values).any() else 0.0
            cells = "".join(_html_cell(value, scale) for value in values)
            rows.append(f"<tr><th style='text-align:right;padding:2px 4px'>{html.escape(token)}</th>{cells}</tr>")
        return "<table style='border-collapse:collapse;font-size:12px'>" + "".join(rows) + "</table>"


def _html_cell(value: float, scale: float) -> str:
    if not np.isfinite(value):
        return "<td style='border:1px solid #eee'></td>"
    share = float(abs(value) / scale) if scale > 0 else 0.0
    colour = GREEN if value >= 0 else RED
    return (f"<td title='{value:.4g}' style='border:1px solid #eee;min-width:18px;"
            f"background:rgba({colour},{share:.3f})'></td>")
