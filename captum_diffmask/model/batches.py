"""What a training or attribution batch holds, and which parts reach the model.

A batch is token ids alone, a tuple ``(ids, *additional_forward_args)`` (Captum's
convention, what ``attribute`` takes), or a mapping such as a tokenizer's
``BatchEncoding`` or a data collator's dict. Targets (``labels`` and kin) are
recognised and never given to the model; anything that cannot be placed is an
error that says how to pass the batch instead.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

#: A batch: the token ids alone, ``(ids, *extra)``, or a mapping with ``input_ids``.
Batch = Union[Tensor, Sequence[Any], Mapping[str, Any]]
#: Mapping keys that hold targets: recognised, never given to the model.
LABEL_KEYS = frozenset({"labels", "label", "label_ids", "start_positions", "end_positions"})
#: Mapping keys a tokenizer may add that describe the text, not the model's input.
TEXT_KEYS = frozenset({"special_tokens_mask", "offset_mapping", "length", "overflow_to_sample_mapping"})
#: The keyword arguments a Hugging Face model takes from a batch, in the order of the
#: positional extras (``additional_forward_args``).
HF_EXTRAS = ("attention_mask", "token_type_ids")
#: An encoder-decoder's (T5, BART, Marian): the encoder's mask, then the decoder's
#: prefix (B, D) and its mask; the ids are the encoder's.
SEQ2SEQ_EXTRAS = ("attention_mask", "decoder_input_ids", "decoder_attention_mask")
#: The extras that run over the ids' positions, (B, T); the decoder's run over its own.
ON_THE_IDS = frozenset({"attention_mask", "token_type_ids"})

_HOW = (
    "pass the batch as a dict with the keys input_ids, attention_mask (and token_type_ids, labels), "
    "or as a tuple (input_ids, attention_mask)"
)


def hf_extras(model: Any) -> Tuple[str, ...]:
    r"""The names of a Hugging Face model's extras, in order: :data:`SEQ2SEQ_EXTRAS`
    for an encoder-decoder (by ``config.is_encoder_decoder``), else :data:`HF_EXTRAS`."""
    config = getattr(model, "config", None)
    return SEQ2SEQ_EXTRAS if bool(getattr(config, "is_encoder_decoder", False)) else HF_EXTRAS


def split_batch(
    batch: Batch, hf_model: bool, forward: Optional[Callable[..., Any]] = None, names: Sequence[str] = HF_EXTRAS,
) -> Tuple[Tensor, Tuple[Any, ...]]:
    r"""
    Splits a batch into ``(inputs, additional_forward_args)``, dropping targets.

    Args:

        batch: token ids (B, T); a tuple ``(ids, *extra)``; or a mapping with
                    ``input_ids`` and any of ``attention_mask``,
                    ``token_type_ids`` (the names of ``names``), the targets of
                    :data:`LABEL_KEYS` and the text keys of :data:`TEXT_KEYS` (both
                    dropped).
        hf_model (bool): the model takes Hugging Face keywords: a tuple's extras
                    are ``names`` in order, those of :data:`ON_THE_IDS` (B, T), and a
                    last element that cannot be one (e.g. (B,) labels) is a target.
        forward (Callable, optional): for other models, the function that takes
                    the extras positionally (the model's ``forward`` or the user's
                    ``forward_func``): one element more than it takes is a target.
                    Default: None
        names (sequence of str, optional): a Hugging Face model's extras
                    (:func:`hf_extras`). Default: :data:`HF_EXTRAS`

    Returns:
        *tuple* ``(ids, extra)``.

    Raises:
        ValueError or TypeError that says how to pass the batch.
    """
    if isinstance(batch, Tensor):
        return batch, ()
    if isinstance(batch, Mapping):
        return _split_mapping(batch, names)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        ids, rest = batch[0], list(batch[1:])
        if hf_model:
            return ids, _hf_extras(ids, rest, names)
        return ids, _positional_extras(ids, rest, forward)
    raise TypeError(f"batch must be token ids, a tuple (ids, *additional_forward_args) or a mapping "
                    f"with 'input_ids', got {type(batch).__name__}")


def _split_mapping(batch: Mapping[str, Any], names: Sequence[str]) -> Tuple[Tensor, Tuple[Any, ...]]:
    if "input_ids" not in batch:
        raise ValueError(f"batch: a mapping batch needs the key 'input_ids', got keys {sorted(batch)}")
    unknown = sorted(set(batch) - {"input_ids", *names, *LABEL_KEYS, *TEXT_KEYS})
    if unknown:
        raise ValueError(
            f"batch: the keys {unknown} cannot be given to the model (it gets input_ids and {', '.join(names)}; "
            "labels are dropped); pass forward_func to feed other inputs"
        )
    extra = [batch.get(key) for key in names]
    while extra and extra[-1] is None:
        extra.pop()
    return batch["input_ids"], tuple(extra)


def _is_target(value: Any, ids: Tensor) -> bool:
    r"""A per-example target: a tensor with one row per example whose shape is not
    that of the ids (class labels (B,), multi-label (B, C), spans (B, 2))."""
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == ids.shape[0] \
        and tuple(value.shape) != tuple(ids.shape)


def _hf_extras(ids: Tensor, rest: list, names: Sequence[str]) -> Tuple[Any, ...]:
    # (ids, mask, labels): the labels never reach the model; an encoder-decoder's
    # (B, D) decoder prefix is not a target, its (B,) class labels are
    decoder = "decoder_input_ids" in names
    if rest and _is_target(rest[-1], ids) and (not decoder or rest[-1].dim() == 1):
        rest = rest[:-1]
    how = _HOW if not decoder else ("pass the batch as a dict with the keys input_ids, attention_mask, "
                                    "decoder_input_ids (and decoder_attention_mask, labels), or as a tuple "
                                    "(input_ids, attention_mask, decoder_input_ids)")
    if len(rest) > len(names):
        raise ValueError(f"batch: a tuple of {len(rest) + 1} elements cannot be read for a Hugging Face model; " + how)
    for name, value in zip(names, rest):
        expected = ids.shape if name in ON_THE_IDS else _decoder_shape(name, rest, names, ids)
        if value is not None and (not isinstance(value, Tensor) or not _fits(value.shape, expected)):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"batch: the element read as {name} has shape {shape}, the ids {tuple(ids.shape)}; "
                             + how)
    return tuple(rest)


def _decoder_shape(name: str, rest: list, names: Sequence[str], ids: Tensor) -> Tuple[Optional[int], ...]:
    r"""The shape a decoder extra must have: the prefix (B, any D); its mask, the
    prefix's shape."""
    prefix = rest[names.index("decoder_input_ids")] if name != "decoder_input_ids" else None
    return tuple(prefix.shape) if isinstance(prefix, Tensor) else (ids.shape[0], None)


def _fits(shape: Sequence[int], expected: Sequence[Optional[int]]) -> bool:
    return len(shape) == len(expected) and all(e is None or s == e for s, e in zip(shape, expected))


def _positional_extras(ids: Tensor, rest: list, forward: Optional[Callable[..., Any]]) -> Tuple[Any, ...]:
    takes = _positional_capacity(forward)
    if takes is not None and len(rest) == takes + 1 and _is_target(rest[-1], ids):
        return tuple(rest[:-1])  # one element more than the forward takes: the target
    if takes is not None and len(rest) > takes:
        raise ValueError(
            f"batch: {len(rest)} additional arguments, but the forward takes {takes} after the ids; drop the "
            "targets from the batch, or pass forward_func"
        )
    return tuple(rest)


def _positional_capacity(forward: Optional[Callable[..., Any]]) -> Optional[int]:
    r"""How many positional arguments ``forward`` takes after the ids; None when it
    takes ``*args`` or cannot be inspected."""
    if forward is None:
        return None
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return max(len(positional) - 1, 0)


def to_device(ids: Tensor, extra: Tuple[Any, ...], device: torch.device) -> Tuple[Tensor, Tuple[Any, ...]]:
    r"""The ids and every tensor among the extras on ``device``."""
    moved = tuple(value.to(device) if isinstance(value, Tensor) else value for value in extra)
    return ids.to(device), moved
