"""What :func:`captum_diffmask.compare` returns: every method's scores on one batch,
their cost against one forward pass, and the ways to show them."""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from matplotlib.figure import Figure
from torch import Tensor

from captum_diffmask.interface.figures import attribution_panels, layer_heatmaps, normalize_unit
from captum_diffmask.interface.html import legend_for, page, Row, table
from captum_diffmask.model.json_values import finite, json_values

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class MethodResult:
    r"""
    One method's outcome in a comparison.

    Attributes:
        name (str): the method's name.
        scores (Tensor, optional): (B, T) float scores at the compared layer, 0 at
                    padding; None when the method failed.
        seconds (float): the ``attribute`` call on the whole batch, in seconds.
        setup_seconds (float): construction and any fitting, in seconds.
        every_layer (Tensor, optional): (B, T, L + 1) scores at every layer, for
                    a DiffMask (its per-layer heatmaps); else None.
        error (str, optional): why the method failed (``errors="record"``).
        options (dict): the options it was given.
        scored (str): what its scores are of (``SiteAttribution.scored``:
                    ``"input"``, ``"hidden.k"``, ...); "" when the method does
                    not say.
        probabilities (bool): its scores are keep probabilities (or a 0/1 mask)
                    on an absolute [0, 1] scale (``scores_are_probabilities``).
        info (dict): what its setup reports (for a fit made by the call: its
                    steps and per-layer convergence).
        metrics (dict): the faithfulness and plausibility scores ``compare``
                    was asked for (``metrics=``), name -> mean over the batch.
        verdicts (dict): layer -> the convergence status of the method's probe
                    there (:func:`~captum_diffmask.interface.verdicts.layer_verdict`);
                    empty for a method without a fit of its own.
    """

    name: str
    scores: Optional[Tensor]
    seconds: float = math.nan
    setup_seconds: float = 0.0
    every_layer: Optional[Tensor] = None
    error: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)
    info: Dict[str, Any] = field(default_factory=dict)
    probabilities: bool = False
    scored: str = ""
    metrics: Dict[str, float] = field(default_factory=dict)
    verdicts: Dict[int, str] = field(default_factory=dict)


@dataclass
class Comparison:
    r"""
    Every method's scores on one batch, with what they cost.

    Attributes:
        methods (dict): name -> :class:`MethodResult`, in the order given.
        tokens (list of list of str): per example, a label per position.
        mask (Tensor): (B, T) bool, True at real tokens.
        layer (int, optional): the layer every method attributed at.
        forward_seconds (float): one forward pass of the model on the batch, the
                    median of several, in seconds.
        metrics (list of str): the metrics each method was scored on, in order.
        words (list of list of str, optional): per example its words, when the
                    batch came from a fast tokenizer (texts, or its
                    ``BatchEncoding``) and ``tokenizer`` was given; else None.
        word_ids (list of list, optional): per example the word of each
                    position (None for special tokens and padding).
    """

    methods: Dict[str, MethodResult]
    tokens: List[List[str]]
    mask: Tensor
    layer: Optional[int]
    forward_seconds: float
    metrics: List[str] = field(default_factory=list)
    words: Optional[List[List[str]]] = None
    word_ids: Optional[List[List[Optional[int]]]] = None

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def scores(self) -> Dict[str, Tensor]:
        r"""name -> (B, T) scores of the methods that ran."""
        return {name: r.scores for name, r in self.methods.items() if r.scores is not None}

    def seconds_per_example(self, name: str) -> float:
        r"""The method's attribution time per example, in seconds."""
        return self.methods[name].seconds / max(self.batch_size, 1)

    def ratio_to_forward(self, name: str) -> float:
        r"""The method's attribution time over one forward pass of the batch."""
        return self.methods[name].seconds / self.forward_seconds if self.forward_seconds > 0 else math.nan

    def table(self) -> str:
        r"""A Markdown table: per method its output, what it scored, time per
        example, time over one forward pass, setup time, its verdict at the
        layer (a fit's convergence status, or a method's check of its own
        numbers: :mod:`~captum_diffmask.interface.verdicts`), its top tokens in the
        first example (or its error) and its metrics; a note when the methods
        score different sites."""
        caption, header, rows, note = self._summary()
        lines = [caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines + (["", note] if note else []))

    def _summary(self) -> Tuple[str, List[str], List[List[str]], str]:
        r"""What :meth:`table` and :meth:`to_html` show: the caption, the header,
        a row of cells per method and the note ("" when none)."""
        caption = (f"Layer {self.layer}, {self.batch_size} examples; one forward pass: "
                   f"{self.forward_seconds * 1e3:.3g} ms for the batch.")
        header = ["method", "scores", "of", "s / example", "x one forward pass", "setup s", "verdict",
                  "top tokens (example 0)"] + list(self.metrics)
        rows = []
        for name, result in self.methods.items():
            if result.scores is None:
                rows.append([name, "failed", "", "", "", f"{result.setup_seconds:.3g}", "", str(result.error)]
                            + [""] * len(self.metrics))
                continue
            shape = "x".join(str(n) for n in result.scores.shape)
            verdict = result.verdicts.get(self.layer, "") if self.layer is not None else ""
            rows.append([name, shape, result.scored, f"{self.seconds_per_example(name):.3g}",
                         f"{self.ratio_to_forward(name):.3g}", f"{result.setup_seconds:.3g}", verdict,
                         ", ".join(self.top_tokens(name))]
                        + [f"{result.metrics.get(metric, math.nan):.3g}" for metric in self.metrics])
        sites = {result.scored.split(" ")[0] for result in self.methods.values() if result.scores is not None}
        note = ""
        if len(sites - {""}) > 1:
            note = (f"Note: at layer {self.layer} these methods score different things "
                    f"({', '.join(sorted(sites - {''}))}): compare rows of the same site only.")
        return caption, header, rows, note

    def word_scores(self, name: str, example: int = 0) -> Tensor:
        r"""
        A method's scores of ``example`` merged into its words
        (:attr:`words`): the largest piece for keep probabilities, the sum for
        other scores (:func:`~captum_diffmask.model.texts.merge_into_words`).

        Returns:
            *Tensor* (W,) for the example's W words.

        Raises:
            ValueError: when the comparison has no words (see :attr:`words`).
        """
        result = self.methods[name]
        if self.word_ids is None:
            raise ValueError("this comparison has no words: give compare texts or a fast tokenizer's BatchEncoding, "
                             "with tokenizer=")
        if result.scores is None:
            raise ValueError(f"{name} failed: {result.error}")
        return self._by_word(result.scores[example], example, result.probabilities)

    def _by_word(self, scores: Tensor, example: int, probabilities: bool) -> Tensor:
        r"""(T,) or (T, K) scores of ``example`` merged into its words by the
        rule for what they are (:func:`~captum_diffmask.model.texts.word_rule`)."""
        from captum_diffmask.model.texts import merge_into_words, word_rule

        assert self.word_ids is not None
        return merge_into_words(scores, self.word_ids[example], word_rule(probabilities))

    def top_tokens(self, name: str, example: int = 0, k: int = 3) -> List[str]:
        r"""The ``k`` highest-scoring real tokens of ``example`` for a method."""
        scores = self.methods[name].scores
        if scores is None:
            return []
        real = self.mask[example].nonzero().flatten().tolist()
        ranked = sorted(real, key=lambda t: -float(scores[example, t]))[:k]
        return [self.tokens[example][t] for t in ranked]

    def plot(self, path: Optional[PathLike] = None, example: int = 0, title: Optional[str] = None) -> List[Figure]:
        r"""
        The panel figure of ``example`` (one row per method) and, for every
        method with per-layer scores (DiffMask), a tokens x layers heatmap.
        Rows of relative scores (gradients, occlusion, ...) are scaled to their
        maximum; rows of keep probabilities or masks (DiffMask, the per-example
        masks, exact erasure) are drawn as they are, so that a mask that drops
        every token looks empty; the row label says which.

        Args:

            path (str or PathLike, optional): the panel figure's PNG; each heatmap
                        goes beside it as ``STEM-NAME-layers.png``. Default: None
            example (int, optional): the example shown. Default: 0
            title (str, optional): the panel figure's title. Default: None

        Returns:
            *list* of figures: the panel figure first.
        """
        if not 0 <= example < self.batch_size:
            raise ValueError(f"example must be in 0..{self.batch_size - 1}, got {example}")
        real = self.mask[example].nonzero().flatten()
        tokens = [self.tokens[example][t] for t in real.tolist()]
        rows = {}
        for name, scores in self.scores.items():
            values = scores[example, real]
            if self.methods[name].probabilities:
                rows[f"{name} (P kept)"] = values.clamp(0.0, 1.0)
            else:
                rows[f"{name} (/ max)"] = normalize_unit(values)
        if not rows:
            raise ValueError("no method produced scores to plot")
        panel_title = f"layer {self.layer}" if self.layer is not None else "every layer"
        figures = [attribution_panels(tokens, [(panel_title, rows)], path, title=title, normalize=False)]
        for name, result in self.methods.items():
            if result.every_layer is not None:
                heatmap_path = _beside(path, f"{name}-layers") if path is not None else None
                matrix = result.every_layer[example, real]
                figures.append(layer_heatmaps(tokens, {f"{name}, every layer": (matrix, None)}, heatmap_path,
                                              per_layer=False))
        return figures

    def to_html(self, examples: Optional[Sequence[int]] = None, words: Optional[bool] = None) -> str:
        r"""
        A self-contained HTML page, the methods side by side: the table the
        terminal prints (:meth:`table`: times, metrics), a legend, then per
        example a row per method over its real tokens or its words (a
        DiffMask's every layer as rows of its own, each with its convergence
        verdict). Keep probabilities are drawn on their absolute 0..1 scale,
        other scores scaled to the row's largest magnitude; a failed method's
        row names its error.

        Args:

            examples (sequence of int, optional): which examples; all when None.
                        Default: None
            words (bool, optional): cells are words (each method's scores merged
                        by its rule, :meth:`word_scores`) or word pieces; None:
                        words where the comparison has them. Default: None

        Returns:
            *str*, the HTML document.
        """
        by_word = self.words is not None if words is None else words
        if by_word and self.words is None:
            raise ValueError("words=True: this comparison has no words (give compare texts with tokenizer=)")
        chosen = range(self.batch_size) if examples is None else examples
        per_example = [self._html_rows(b, by_word) for b in chosen]
        tables = [table(f"example {b}", rows) for b, rows in zip(chosen, per_example)]
        legend = legend_for([row for rows in per_example for row in rows])
        return page("Comparison", f"(layer {self.layer})", [self._html_summary(), legend] + tables)

    def _html_summary(self) -> str:
        caption, header, rows, note = self._summary()
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
        note_html = f"<p>{html.escape(note)}</p>" if note else ""
        return (f"<p>{html.escape(caption)}</p><table class='metrics'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{note_html}")

    def _html_rows(self, example: int, by_word: bool) -> List[Row]:
        real = self.mask[example].nonzero().flatten().tolist()
        labels = self.words[example] if by_word and self.words else [self.tokens[example][t] for t in real]

        def cells(scores: Tensor, probabilities: bool) -> Tensor:
            return self._by_word(scores, example, probabilities) if by_word else scores[real]

        rows: List[Row] = []
        for name, result in self.methods.items():
            if result.scores is None:
                rows.append(Row(f"{name} (failed: {result.error})", [], [], False))
                continue
            label = f"{name}, {result.scored}" if result.scored else name
            verdict = result.verdicts.get(self.layer, "") if self.layer is not None else ""
            rows.append(Row(label, labels, cells(result.scores[example], result.probabilities).tolist(),
                            result.probabilities, verdict))
            if result.every_layer is not None:
                every = cells(result.every_layer[example], result.probabilities)
                rows += [Row(f"{name}, layer {k}", labels, every[:, k].tolist(), result.probabilities,
                             result.verdicts.get(k, "")) for k in range(every.shape[-1])]
        return rows

    def to_dict(self) -> Dict[str, Any]:
        r"""Everything as JSON-ready Python values (scores as nested lists)."""
        methods = {}
        for name, r in self.methods.items():
            methods[name] = {
                "scores": None if r.scores is None else r.scores.tolist(),
                "every_layer": None if r.every_layer is None else r.every_layer.tolist(),
                "seconds": finite(r.seconds), "setup_seconds": finite(r.setup_seconds),
                "seconds_per_example": None if r.scores is None else finite(self.seconds_per_example(name)),
                "ratio_to_forward": None if r.scores is None else finite(self.ratio_to_forward(name)),
                "error": r.error, "options": json_values(r.options), "scored": r.scored, "probabilities": r.probabilities,
                "info": json_values(r.info), "metrics": {k: finite(v) for k, v in r.metrics.items()},
                "verdicts": {str(k): v for k, v in r.verdicts.items()},
            }
        return {"layer": self.layer, "batch_size": self.batch_size, "forward_seconds": self.forward_seconds,
                "tokens": self.tokens, "mask": self.mask.int().tolist(), "methods": methods,
                "metrics": list(self.metrics), "words": self.words,
                "word_scores": None if self.words is None else {
                    name: [self.word_scores(name, b).tolist() for b in range(self.batch_size)]
                    for name, r in self.methods.items() if r.scores is not None}}

    def to_dataframe(self) -> Any:
        r"""
        A pandas ``DataFrame``, a row per method: what it scored, its times and
        its metrics (pandas is an extra: ``pip install captum_diffmask[dataframe]``).

        Raises:
            ImportError: naming the extra, when pandas is not installed.
        """
        try:
            import pandas
        except ImportError as error:
            raise ImportError("Comparison.to_dataframe needs pandas: pip install 'captum_diffmask[dataframe]'") \
                from error
        rows = []
        for name, r in self.methods.items():
            ran = r.scores is not None
            rows.append({"method": name, "scored": r.scored, "error": r.error,
                         "seconds_per_example": self.seconds_per_example(name) if ran else math.nan,
                         "ratio_to_forward": self.ratio_to_forward(name) if ran else math.nan,
                         "setup_seconds": r.setup_seconds,
                         **{metric: r.metrics.get(metric, math.nan) for metric in self.metrics}})
        return pandas.DataFrame(rows).set_index("method")


def _beside(path: PathLike, suffix: str) -> str:
    stem, extension = os.path.splitext(os.fspath(path))
    return f"{stem}-{suffix}{extension or '.png'}"


def token_labels(ids: Tensor, tokenizer: Any = None, tokens: Optional[Sequence[Sequence[str]]] = None) -> List[List[str]]:
    r"""
    A label per position: ``tokens`` as given, else the tokenizer's
    ``convert_ids_to_tokens``, else the ids as text.

    Args:

        ids (Tensor): (B, T) token ids.
        tokenizer (optional): a Hugging Face tokenizer. Default: None
        tokens (sequence of sequence of str, optional): the labels, (B, T).
                    Default: None

    Returns:
        *list* of B lists of T strings.
    """
    if tokens is not None:
        labels = [[str(t) for t in row] for row in tokens]
        if len(labels) != ids.shape[0] or any(len(row) != ids.shape[1] for row in labels):
            raise ValueError(f"tokens must hold {ids.shape[1]} labels for each of {ids.shape[0]} examples")
        return labels
    if tokenizer is not None:
        return [list(tokenizer.convert_ids_to_tokens(row.tolist())) for row in ids]
    return [[str(int(t)) for t in row] for row in ids]
