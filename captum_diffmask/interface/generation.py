"""Attributing generated text: each token a decoder-only language model generates,
to the prompt and to the tokens generated before it; each token an encoder-decoder
(T5, BART, Marian) generates, to its encoder's input.

A generated token at step t is the model's next-token output after the prefix
``prompt + generated[:t]``. :func:`attribute_generation` builds the N prefixes as one
left-padded batch (padding never changes a next-token output:
:func:`~captum_diffmask.model.forward.padded_positions`) and asks any method of the
library for its (B, T) scores, or DiffMask's (B, T, L + 1) at every layer; the
rows are then aligned on the source tokens into a steps x sources matrix.

An encoder-decoder's step t is its next-token output after the decoder prefix
``[decoder start] + generated[:t]``, attributed to the encoder's tokens (the same
S at every step; the decoder's prefix is given, not attributed).

Amortised DiffMask is fitted once on a corpus of such prefixes
(:func:`prefix_batches`), not per example, and then attributes every step of a
generation in one pass.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.interface.generation_result import GenerationAttribution
from captum_diffmask.interface.verdicts import layer_verdicts
from captum_diffmask.model.attribution import method_name, method_trait
from captum_diffmask.model.forward import model_device, ModelForward
from captum_diffmask.model.outputs import is_seq2seq_lm
from captum_diffmask.model.texts import decoded_words

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

        model (nn.Module): a causal language model, or an encoder-decoder one
                    (the prompt is then its encoder's input).
        prompt (Tensor or list of int): (S,) or (1, S) ids.
        max_new_tokens (int): N >= 1.
        eos_token_id (int, optional): generation stops after this token. Default: None
        forward_func (Callable, optional): as in :class:`ModelForward`. Default: None

    Returns:
        *Tensor* (n,) long, the generated ids, n <= N.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    forward = ModelForward(model, forward_func, output="last")
    prompt_ids = _as_ids(prompt, "prompt").to(model_device(model))
    encoder_decoder = forward_func is None and is_seq2seq_lm(model)
    generated: List[int] = []
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            if encoder_decoder:  # the source stays; the decoder's prefix grows
                ids, extra = _encoder_decoder_call(model, prompt_ids, [generated])
            else:
                ids = torch.cat([prompt_ids, prompt_ids.new_tensor(generated)]).unsqueeze(0)
                extra = (torch.ones_like(ids),)
            token = int(forward(ids, extra)[0].argmax())
            generated.append(token)
            if token == eos_token_id:
                break
    finally:
        model.train(was_training)
    return torch.tensor(generated, dtype=torch.long)


def _encoder_decoder_call(model: nn.Module, source: Tensor, steps: Sequence[Sequence[int]]) -> Tuple[Tensor, tuple]:
    r"""One row per decoder prefix ``[start] + tokens``: the source (S,) repeated,
    and ``(attention_mask, decoder_input_ids, decoder_attention_mask)`` with the
    prefixes right-padded (causal attention: a pad after a prefix changes none of
    its positions)."""
    start = getattr(model.config, "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise ValueError(f"{type(model).__name__}: config.decoder_start_token_id is not set; the decoder's prefix "
                         "starts with it")
    ids = source.unsqueeze(0).repeat(len(steps), 1)
    length = 1 + max(len(tokens) for tokens in steps)
    prefix = torch.full((len(steps), length), start, dtype=torch.long, device=source.device)
    prefix_mask = torch.zeros_like(prefix)
    for row, tokens in enumerate(steps):
        prefix[row, 1:1 + len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        prefix_mask[row, :1 + len(tokens)] = 1
    return ids, (torch.ones_like(ids), prefix, prefix_mask)


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
    the bottleneck) gets the generated token as its target. For an
    encoder-decoder the prompt is the encoder's input, the only sources: step t
    is the next token after the decoder prefix ``[start] + generated[:t]``.

    Args:

        model (nn.Module): a causal language model (its logits (B, T, V)), or an
                    encoder-decoder one (T5, BART, Marian).
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
        (N, S + N - 1, L + 1); an encoder-decoder's (N, S) or (N, S, L + 1).
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
    encoder_decoder = is_seq2seq_lm(model)
    chunks = _attribute_prefixes(method, sequence, len(prompt_ids), layer, batch_size, attribute_options,
                                 model if encoder_decoder else None)
    scores, defined = _align(chunks, len(prompt_ids), len(generated), encoder_decoder)
    tokens = (list(tokenizer.convert_ids_to_tokens(sequence.tolist())) if tokenizer is not None
              else [str(i) for i in sequence.tolist()])
    sources = sequence[:len(prompt_ids)] if encoder_decoder else sequence[:-1]
    word_ids, words = decoded_words(tokenizer, sources.tolist()) if tokenizer is not None else (None, None)
    layers = list(range(scores.shape[-1])) if scores.dim() == 3 else None
    return GenerationAttribution(sequence, len(prompt_ids), scores, defined, tokens, method_name(method),
                                 layers, None if layers is not None else layer, word_ids, words,
                                 bool(method_trait(method, "scores_are_probabilities")), encoder_decoder,
                                 layer_verdicts(method, layers or [layer]))


def _attribute_prefixes(
    method: Any, sequence: Tensor, prompt_length: int, layer: Optional[int], batch_size: int,
    options: dict, encoder_decoder: Optional[nn.Module] = None,
) -> Iterator[Tuple[List[int], Tensor]]:
    r"""Yields ``(prefix lengths, scores)`` per chunk of prefixes, scores (b, T[, K])
    left-padded as the chunk was; for ``encoder_decoder`` (the model), (b, S[, K])
    over the encoder's input, a step's prefix being its decoder's."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    lengths = list(range(prompt_length, len(sequence)))
    for start in range(0, len(lengths), batch_size):
        chunk = lengths[start:start + batch_size]
        if encoder_decoder is not None:
            steps = [sequence[prompt_length:n].tolist() for n in chunk]
            ids, extra = _encoder_decoder_call(encoder_decoder, sequence[:prompt_length], steps)
        else:
            ids, mask = left_pad([sequence[:n] for n in chunk])
            extra = (mask,)
        call = dict(options)
        if method_trait(method, "uses_target") and "target" not in call:
            call["target"] = sequence[chunk]
        scores = method.attribute(ids, additional_forward_args=extra, layer=layer, **call)
        yield chunk, scores.detach().cpu().float()


def _align(
    chunks: Iterator[Tuple[List[int], Tensor]], prompt_length: int, steps: int, encoder_decoder: bool = False,
) -> Tuple[Tensor, Tensor]:
    r"""The (N, S + N - 1[, K]) matrix of steps x sources from the left-padded
    chunks; an encoder-decoder's (N, S[, K]), every source defined at every step."""
    if encoder_decoder:
        pieces = list(chunks)
        return torch.cat([chunk for _, chunk in pieces]), torch.ones(steps, prompt_length, dtype=torch.bool)
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
