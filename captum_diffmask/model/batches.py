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

_HOW = (
    "pass the batch as a dict with the keys input_ids, attention_mask (and token_type_ids, labels), "
    "or as a tuple (input_ids, attention_mask)"
)


def split_batch(
    batch: Batch, hf_model: bool, forward: Optional[Callable[..., Any]] = None
) -> Tuple[Tensor, Tuple[Any, ...]]:
    r"""
    Splits a batch into ``(inputs, additional_forward_args)``, dropping targets.

    Args:

        batch: token ids (B, T); a tuple ``(ids, *extra)``; or a mapping with
                    ``input_ids`` and any of ``attention_mask``,
                    ``token_type_ids``, the targets of :data:`LABEL_KEYS` and the
                    text keys of :data:`TEXT_KEYS` (both dropped).
        hf_model (bool): the model takes Hugging Face keywords: a tuple's extras
                    are ``(attention_mask[, token_type_ids])``, each (B, T), and a
                    last element of another shape (e.g. (B,) labels) is a target.
        forward (Callable, optional): for other models, the function that takes
                    the extras positionally (the model's ``forward`` or the user's
                    ``forward_func``): one element more than it takes is a target.
                    Default: None

    Returns:
        *tuple* ``(ids, extra)``.

    Raises:
        ValueError or TypeError that says how to pass the batch.
    """
    if isinstance(batch, Tensor):
        return batch, ()
    if isinstance(batch, Mapping):
        return _split_mapping(batch)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        ids, rest = batch[0], list(batch[1:])
        if hf_model:
            return ids, _hf_extras(ids, rest)
        return ids, _positional_extras(ids, rest, forward)
    raise TypeError(f"batch must be token ids, a tuple (ids, *additional_forward_args) or a mapping "
                    f"with 'input_ids', got {type(batch).__name__}")


def _split_mapping(batch: Mapping[str, Any]) -> Tuple[Tensor, Tuple[Any, ...]]:
    if "input_ids" not in batch:
        raise ValueError(f"batch: a mapping batch needs the key 'input_ids', got keys {sorted(batch)}")
    unknown = sorted(set(batch) - {"input_ids", *HF_EXTRAS, *LABEL_KEYS, *TEXT_KEYS})
    if unknown:
        raise ValueError(
            f"batch: the keys {unknown} cannot be given to the model (it gets input_ids, attention_mask and "
            "token_type_ids; labels are dropped); pass forward_func to feed other inputs"
        )
    extra = [batch.get(key) for key in HF_EXTRAS]
    while extra and extra[-1] is None:
        extra.pop()
    return batch["input_ids"], tuple(extra)


def _is_target(value: Any, ids: Tensor) -> bool:
    r"""A per-example target: a tensor with one row per example whose shape is not
    that of the ids (class labels (B,), multi-label (B, C), spans (B, 2))."""
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == ids.shape[0] \
        and tuple(value.shape) != tuple(ids.shape)


def _hf_extras(ids: Tensor, rest: list) -> Tuple[Any, ...]:
    if rest and _is_target(rest[-1], ids):
        rest = rest[:-1]  # (ids, mask, labels): the labels never reach the model
    if len(rest) > len(HF_EXTRAS):
        raise ValueError(f"batch: a tuple of {len(rest) + 1} elements cannot be read for a Hugging Face model; " + _HOW)
    for name, value in zip(HF_EXTRAS, rest):
        if value is not None and (not isinstance(value, Tensor) or tuple(value.shape) != tuple(ids.shape)):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"batch: the element read as {name} has shape {shape}, the ids {tuple(ids.shape)}; " + _HOW)
    return tuple(rest)


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
