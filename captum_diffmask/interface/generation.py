"""Attributing generated text: each token a decoder-only language model generates,
to the prompt and to the tokens generated before it.

A generated token at step t is the model's next-token output after the prefix
``prompt + generated[:t]``. :func:`attribute_generation` builds the N prefixes as one
left-padded batch (padding never changes a next-token output:
:func:`~captum_diffmask.model.forward.padded_positions`) and asks any method of the
library for its (B, T) scores, or DiffMask's (B, T, L + 1) at every layer; the
rows are then aligned on the source tokens into a steps x sources matrix.

Amortised DiffMask is fitted once on a corpus of such prefixes
(:func:`prefix_batches`), not per example, and then attributes every step of a
generation in one pass.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn, Tensor

from captum_diffmask.interface.figures import PathLike, save_figure
from captum_diffmask.model.attribution import method_name, method_trait
from captum_diffmask.model.forward import model_device, ModelForward
from captum_diffmask.model.texts import decoded_words, merge_into_words, word_rule

__all__ = ["GenerationAttribution", "attribute_generation", "greedy_continuation", "left_pad", "prefix_batches"]

Ids = Union[Tensor, Sequence[int]]


def _as_ids(ids: Ids, argument: str) -> Tensor:
    r"""A 1-D long tensor of token ids from (S,), (1, S), a list, or a tokenizer's
    output of one sequence (its ``input_ids``); errors name ``argument``."""
    if isinstance(ids, str):
        raise TypeError(f"{argument} must be token ids, got a string: pass tokenizer= (attribute_generation "
                        f"tokenises a string prompt with it), or tokenize it first, e.g. "
                        f"tokenizer({ids[:20]!r}, return_tensors='pt')")
    if isinstance(ids, Mapping):
        if "input_ids" not in ids:
            raise ValueError(f"{argument}: a mapping must hold 'input_ids', got keys {sorted(ids)}")
        ids = ids["input_ids"]
    try:
        tensor = torch.as_tensor(ids).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{argument} must be token ids (a Tensor or a list of int), got {type(ids).__name__}: {error}") from None
    if tensor.dim() == 2 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if tensor.dim() != 1 or tensor.numel() == 0:
        raise ValueError(f"{argument} must hold the ids of one sequence, shape (S,) or (1, S) with S >= 1, "
                         f"got shape {tuple(tensor.shape)}")
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise TypeError(f"{argument} must hold integer token ids, got dtype {tensor.dtype}")
    return tensor.long()


def left_pad(sequences: Sequence[Tensor], pad_id: int = 0) -> Tuple[Tensor, Tensor]:
    r"""
    Sequences of several lengths as one left-padded batch.

    Args:

        sequences (sequence of Tensor): B 1-D id tensors.
        pad_id (int, optional): the id written at padded positions (never read:
                    the attention mask hides them). Default: 0

    Returns:
        *tuple* ``(ids, attention_mask)``, both (B, max length) long.
    """
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, length - len(sequence):] = sequence
        mask[row, length - len(sequence):] = 1
    return ids, mask


@torch.no_grad()
def greedy_continuation(
    model: nn.Module, prompt: Ids, max_new_tokens: int, eos_token_id: Optional[int] = None,
    forward_func: Optional[Any] = None,
) -> Tensor:
    r"""
    The greedy continuation of a prompt (argmax of the next-token output at each
    step; no cache, so any model whose output :class:`ModelForward` reads as
    ``"last"`` works).

    Args:

        model (nn.Module): a causal language model.
        prompt (Tensor, list of int or str): (S,) or (1, S) ids, or a string
                    that ``tokenizer`` tokenises (its special tokens included).
        max_new_tokens (int): N >= 1.
        eos_token_id (int, optional): generation stops after this token. Default: None
        forward_func (Callable, optional): as in :class:`ModelForward`. Default: None

    Returns:
        *Tensor* (n,) long, the generated ids, n <= N.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    forward = ModelForward(model, forward_func, output="last")
    sequence = _as_ids(prompt, "prompt").to(model_device(model))
    generated: List[int] = []
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            ids = sequence.unsqueeze(0)
            token = int(forward(ids, (torch.ones_like(ids),))[0].argmax())
            generated.append(token)
            sequence = torch.cat([sequence, sequence.new_tensor([token])])
            if token == eos_token_id:
                break
    finally:
        model.train(was_training)
    return torch.tensor(generated, dtype=torch.long)


def prefix_batches(
    sequences: Sequence[Ids], prompt_lengths: Union[int, Sequence[int]] = 1, batch_size: int = 32,
    pad_id: int = 0,
) -> List[Tuple[Tensor, Tensor]]:
    r"""
    A corpus for fitting DiffMask on generation: every prefix of every sequence
    (prompt + continuation) that ends before a generated token, as left-padded
    ``(ids, attention_mask)`` batches.

    Args:

        sequences (sequence): the prompts followed by their continuations, each
                    (S_i + N_i,) ids.
        prompt_lengths (int or sequence of int, optional): S_i, the shortest
                    prefix kept (one value for all or one per sequence). Default: 1
        batch_size (int, optional): prefixes per batch. Default: 32
        pad_id (int, optional): see :func:`left_pad`. Default: 0

    Returns:
        *list* of ``(ids, attention_mask)``, each (b, T) long, in sequence order.
    """
    if isinstance(prompt_lengths, int):
        prompt_lengths = [prompt_lengths] * len(sequences)
    if len(prompt_lengths) != len(sequences):
        raise ValueError(f"prompt_lengths must hold one length per sequence ({len(sequences)}), "
                         f"got {len(prompt_lengths)}")
    prefixes = []
    for index, (sequence, start) in enumerate(zip(sequences, prompt_lengths)):
        ids = _as_ids(sequence, f"sequences[{index}]")
        if not 1 <= start < len(ids):
            raise ValueError(f"prompt_lengths[{index}] must be in 1..{len(ids) - 1}, got {start}")
        prefixes += [ids[:end] for end in range(start, len(ids))]
    return [left_pad(prefixes[i:i + batch_size], pad_id) for i in range(0, len(prefixes), batch_size)]


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

    @property
    def generated_ids(self) -> Tensor:
        r"""(N,) the generated ids."""
        return self.ids[self.prompt_length:]

    @property
    def source_tokens(self) -> List[str]:
        r"""The S + N - 1 source tokens (every token but the last generated one)."""
        return self.tokens[:-1]

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
        per layer, a table of steps x sources whose cells are shaded by the score
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
        scale = "the keep probability (0..1)" if self.probabilities else "the score over the row's largest magnitude"
        parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>",
                 "<body style='font-family:sans-serif'>", f"<h2>{title}</h2>",
                 f"<p>Rows: generated tokens, in order. Columns: the prompt (bold) and the "
                 f"{'words' if by_word else 'tokens'} generated before. Shade: {scale} (blue positive, red "
                 "negative); a blank cell comes after its step.</p>"]
        labels, in_prompt = self._columns(by_word)
        for label, matrix in self.matrices(by_word):
            parts.append(f"<h3>{html.escape(label)}</h3>")
            parts.append(self._html_table(matrix, labels, in_prompt))
        parts.append("</body></html>\n")
        page = "\n".join(parts)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
        return page

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
    colour = "0,90,200" if value >= 0 else "200,40,40"
    return (f"<td title='{value:.4g}' style='border:1px solid #eee;min-width:18px;"
            f"background:rgba({colour},{share:.3f})'></td>")


def attribute_generation(
    model: nn.Module,
    method: Any,
    prompt: Ids,
    max_new_tokens: Optional[int] = None,
    layer: Optional[int] = 0,
    continuation: Optional[Ids] = None,
    tokenizer: Any = None,
    eos_token_id: Optional[int] = None,
    batch_size: int = 16,
    **attribute_options: Any,
) -> GenerationAttribution:
    r"""
    Generates from a prompt (greedily), then attributes every generated token to
    the prompt and to the tokens generated before it.

    Step t is attributed on the prefix ``prompt + generated[:t]`` with the
    next-token output at its last position; the prefixes go to ``method`` as
    left-padded batches, and a method that takes a target (the gradient methods,
    the bottleneck) gets the generated token as its target.

    Args:

        model (nn.Module): a causal language model (its logits (B, T, V)).
        method: any attribution of the library on ``model`` (DiffMask already
                    fitted, e.g. on :func:`prefix_batches` of a corpus).
        prompt (Tensor, list of int or str): (S,) or (1, S) ids, or a string
                    that ``tokenizer`` tokenises (its special tokens included).
        max_new_tokens (int, optional): N, the tokens to generate; not needed
                    when ``continuation`` is given. Default: None
        layer (int or None, optional): the layer attributed (0: the input
                    tokens); None for every layer (DiffMask). Default: 0
        continuation (Tensor or list of int, optional): the tokens to attribute
                    instead of the greedy ones (e.g. from ``model.generate`` with
                    sampling). Default: None
        tokenizer (optional): tokenises a string prompt, turns ids into token
                    strings and the sources into words (whitespace-delimited:
                    :func:`~captum_diffmask.model.texts.decoded_words`) for the
                    result's word scores, plot and HTML. Default: None
        eos_token_id (int, optional): greedy generation stops after it. Default: None
        batch_size (int, optional): prefixes per ``attribute`` call. Default: 16
        **attribute_options: passed to ``method.attribute`` (e.g. ``n_steps``).

    Returns:
        :class:`GenerationAttribution` with scores (N, S + N - 1) or
        (N, S + N - 1, L + 1).
    """
    if isinstance(prompt, str) and tokenizer is not None:
        prompt = tokenizer(prompt, return_tensors="pt")["input_ids"]
    prompt_ids = _as_ids(prompt, "prompt")
    if continuation is None:
        if max_new_tokens is None:
            raise ValueError("max_new_tokens is needed when no continuation is given")
        continuation = greedy_continuation(model, prompt_ids, max_new_tokens, eos_token_id)
    generated = _as_ids(continuation, "continuation")
    sequence = torch.cat([prompt_ids, generated])
    chunks = _attribute_prefixes(method, sequence, len(prompt_ids), layer, batch_size, attribute_options)
    scores, defined = _align(chunks, len(prompt_ids), len(generated))
    tokens = (list(tokenizer.convert_ids_to_tokens(sequence.tolist())) if tokenizer is not None
              else [str(i) for i in sequence.tolist()])
    word_ids, words = decoded_words(tokenizer, sequence[:-1].tolist()) if tokenizer is not None else (None, None)
    layers = list(range(scores.shape[-1])) if scores.dim() == 3 else None
    return GenerationAttribution(sequence, len(prompt_ids), scores, defined, tokens, method_name(method),
                                 layers, None if layers is not None else layer, word_ids, words,
                                 bool(method_trait(method, "scores_are_probabilities")))


def _attribute_prefixes(
    method: Any, sequence: Tensor, prompt_length: int, layer: Optional[int], batch_size: int,
    options: dict,
) -> Iterator[Tuple[List[int], Tensor]]:
    r"""Yields ``(prefix lengths, scores)`` per chunk of prefixes, scores (b, T[, K])
    left-padded as the chunk was."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    lengths = list(range(prompt_length, len(sequence)))
    for start in range(0, len(lengths), batch_size):
        chunk = lengths[start:start + batch_size]
        ids, mask = left_pad([sequence[:n] for n in chunk])
        call = dict(options)
        if method_trait(method, "uses_target") and "target" not in call:
            call["target"] = sequence[chunk]
        scores = method.attribute(ids, additional_forward_args=(mask,), layer=layer, **call)
        yield chunk, scores.detach().cpu().float()


def _align(chunks: Iterator[Tuple[List[int], Tensor]], prompt_length: int, steps: int) -> Tuple[Tensor, Tensor]:
    r"""The (N, S + N - 1[, K]) matrix of steps x sources from the left-padded chunks."""
    sources = prompt_length + steps - 1
    scores: Optional[Tensor] = None
    defined = torch.zeros(steps, sources, dtype=torch.bool)
    for lengths, chunk in chunks:
        if scores is None:
            scores = torch.zeros(steps, sources, *chunk.shape[2:])
        for row, length in enumerate(lengths):
            step = length - prompt_length
            scores[step, :length] = chunk[row, chunk.shape[1] - length:]
            defined[step, :length] = True
    assert scores is not None
    return scores, defined
