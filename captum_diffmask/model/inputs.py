"""What a call's inputs must be: token ids of rank 2, inside the model's
vocabulary and positions, for a model that takes token ids. Each check raises an
error that names the argument and the fix (the model's own would name neither)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import nn, Tensor

from captum_diffmask.model.forward import is_hf_model


#: What a Hugging Face model takes when its main input is not token ids.
NOT_TEXT = {"pixel_values": "images", "input_features": "audio features", "input_values": "audio waveforms",
            "pixel_values_videos": "videos"}


def check_text_model(model: nn.Module) -> None:
    r"""Refuses, when it is built, a Hugging Face model whose main input is not
    token ids (a ViT's ``pixel_values``, Whisper's ``input_features``): every
    method of the library gates or replaces token positions."""
    main_input = getattr(model, "main_input_name", None) if is_hf_model(model) else None
    if main_input in NOT_TEXT:
        raise ValueError(
            f"model: {type(model).__name__} takes {NOT_TEXT[main_input]} (its main input is {main_input}), not "
            "token ids: the library attributes token ids read through an embedding table (text encoders, "
            "decoders, encoder-decoders, question-answering heads; any PyTorch module given sites=)")


def check_token_ids(inputs: Any, argument: str = "inputs") -> Tuple[Tensor, bool]:
    r"""
    Validates token ids given as a Tensor or a 1-tuple of a Tensor (Captum style).

    Returns:
        *tuple* ``(ids, was_tuple)``: ids of shape (B, T), integer dtype.

    Raises:
        TypeError: not a tensor of an integer dtype.
        ValueError: not of rank 2 (batch, tokens).
    """
    was_tuple = isinstance(inputs, tuple)
    if was_tuple:
        if len(inputs) != 1:
            raise ValueError(
                f"{argument} must be one tensor of token ids, a 1-tuple of it, or a batch tuple "
                f"(ids, *additional_forward_args), got a tuple of {len(inputs)}"
            )
        inputs = inputs[0]
    if not isinstance(inputs, Tensor):
        raise TypeError(f"{argument} must be a Tensor of token ids, got {type(inputs).__name__}")
    if inputs.dtype.is_floating_point or inputs.dtype.is_complex or inputs.dtype == torch.bool:
        raise TypeError(f"{argument} must hold integer token ids, got dtype {inputs.dtype}")
    if inputs.dim() != 2:
        raise ValueError(
            f"{argument} must have shape (batch, tokens), got {tuple(inputs.shape)}"
        )
    if inputs.shape[0] == 0 or inputs.shape[1] == 0:
        raise ValueError(f"{argument} must hold at least one example of at least one token, got shape "
                         f"{tuple(inputs.shape)}")
    return inputs, was_tuple


def check_vocabulary(ids: Tensor, size: Optional[int], argument: str = "inputs") -> None:
    r"""Token ids must index the embedding table (``0 .. size - 1``); ValueError
    naming ``argument`` and the size (the embedding's own error does neither)."""
    if size is None or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= size:
        raise ValueError(f"{argument} holds token ids {low}..{high}, but the model's embedding has {size} "
                         f"entries (ids 0..{size - 1})")


#: The names Hugging Face gives a learned table of absolute positions (BERT's,
#: GPT-2's, BART's and OPT's); rotary and relative positions have no such table.
POSITION_TABLES = ("position_embeddings", "wpe", "embed_positions")


def position_limit(model: nn.Module) -> Optional[int]:
    r"""
    The most tokens a call may hold when the model looks positions up in a learned
    table (:data:`POSITION_TABLES`): the table's rows less the rows before the
    first position (RoBERTa's ``padding_idx + 1``, BART's ``offset``).

    Args:

        model (nn.Module): the analysed model.

    Returns:
        *int* or None: None for a model without such a table (no limit known).
    """
    limits = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_TABLES:
            skipped = getattr(module, "offset", 0) if isinstance(getattr(module, "offset", 0), int) else 0
            if module.padding_idx is not None:
                skipped += module.padding_idx + 1
            limits.append(module.num_embeddings - skipped)
    return min(limits) if limits else None


def check_positions(ids: Tensor, limit: Optional[int], argument: str = "inputs") -> None:
    r"""At most ``limit`` tokens a call (:func:`position_limit`); ValueError naming
    ``argument`` and the fix (the model's own error is a tensor size mismatch)."""
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"{argument} holds {ids.shape[1]} tokens, but the model has {limit} positions: truncate "
                         f"the texts, e.g. tokenizer(..., truncation=True, max_length={limit}) (explain's "
                         "max_length, the command line's --max-length)")
