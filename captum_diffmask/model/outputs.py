"""The output a method preserves or attributes, declared rather than guessed.

Every method reads the model's output as one or several distributions per
example, as logits of shape (B, C) for one distribution (class logits, or the
next token at the last real position of a language model; a single binary logit
(B,) is a Bernoulli), or (B, K, C) for K of them (every real position of a
language model; a question-answering head's start and end over the positions).
Divergences sum over the K distributions; padding never counts.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import torch
from torch import nn, Tensor

#: The outputs a method can be told to keep (``output=``).
OUTPUTS = ("auto", "classes", "last", "all", "span")


def is_causal_lm(model: nn.Module) -> bool:
    r"""A decoder-only language model: its class is a ``...ForCausalLM`` or
    ``...LMHeadModel`` or in transformers' causal-LM auto-mapping (e.g.
    ``BertGenerationDecoder``), or its config says ``is_decoder`` without an
    encoder."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    decoder = bool(getattr(config, "is_decoder", False)) and not bool(getattr(config, "is_encoder_decoder", False))
    return name.endswith("ForCausalLM") or name.endswith("LMHeadModel") or decoder or name in _causal_lm_classes()


def is_seq2seq_lm(model: nn.Module) -> bool:
    r"""An encoder-decoder language model (T5, BART, Marian): its config says
    ``is_encoder_decoder`` and its class is in transformers' sequence-to-sequence
    LM auto-mapping. Its logits are over the positions of the decoder's prefix."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and type(model).__name__ in _seq2seq_lm_classes()


def _causal_lm_classes() -> frozenset:
    r"""The class names in transformers' causal-LM auto-mapping (empty when
    transformers is not installed)."""
    return _mapped_classes("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")


def _seq2seq_lm_classes() -> frozenset:
    return _mapped_classes("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES")


@functools.lru_cache(maxsize=None)
def _mapped_classes(mapping: str) -> frozenset:
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return frozenset()
    names = set()
    for classes in getattr(modeling_auto, mapping, {}).values():
        names.update((classes,) if isinstance(classes, str) else classes)
    return frozenset(names)


def _field(output: Any, name: str) -> Optional[Tensor]:
    value = getattr(output, name, None)
    if value is None and isinstance(output, Mapping):
        value = output.get(name)
    return value if isinstance(value, Tensor) else None


def raw_logits(output: Any) -> Tensor:
    r"""The logits inside a model output: a Tensor, ``.logits``, ``["logits"]``,
    the start and end logits of a question-answering head stacked as (B, 2, T),
    or the first element of a tuple."""
    if isinstance(output, Tensor):
        return output
    logits = _field(output, "logits")
    if logits is not None:
        return logits
    start, end = _field(output, "start_logits"), _field(output, "end_logits")
    if start is not None and end is not None:
        return torch.stack([start, end], dim=1)
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    raise TypeError(f"cannot read logits from a model output of type {type(output).__name__}; "
                    "pass forward_func returning a Tensor")


def resolve_output(kind: str, output: Any, model: nn.Module) -> str:
    r"""The declared output kind, ``"auto"`` resolved from the output's form and
    the model; errors name ``output=`` and ``forward_func``."""
    if kind not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {kind!r}")
    if kind != "auto":
        return kind
    if not isinstance(output, Tensor) and _field(output, "start_logits") is not None:
        return "span"
    logits = raw_logits(output)
    if logits.dim() <= 2:
        return "classes"
    if logits.dim() == 3 and (is_causal_lm(model) or is_seq2seq_lm(model)):
        return "last"
    raise ValueError(
        f"the model returns logits of shape {tuple(logits.shape)}: declare the output to keep with output='last' "
        "(the distribution at the last real position) or output='all' (every real position), or pass "
        "forward_func returning (B, C) logits"
    )


def read_output(output: Any, kind: str, mask: Tensor) -> Tensor:
    r"""
    The distributions a method keeps, as logits.

    Args:

        output (Any): the model's output.
        kind (str): a resolved kind of :data:`OUTPUTS` (not ``"auto"``).
        mask (Tensor): (B, T) bool, True at real tokens.

    Returns:
        *Tensor*: (B, C) or (B,) for ``"classes"``; (B, V) for ``"last"`` (each
        row's last real position, left or right padding alike); (B, T, V) for
        ``"all"`` with padded positions set to 0 logits (a uniform distribution
        in the original and the masked output alike: KL 0); (B, 2, T) for
        ``"span"`` with padded positions at the dtype's lowest value (never a
        start or an end).
    """
    logits = raw_logits(output)
    if kind == "classes":
        if logits.dim() > 2:
            raise ValueError(f"output='classes' needs (B, C) logits, the model returns {tuple(logits.shape)}")
        return logits
    expected = 3 if kind in ("last", "all") else None
    if kind == "span":
        if logits.dim() != 3 or logits.shape[1] != 2 or logits.shape[2] != mask.shape[1]:
            raise ValueError(f"output='span' needs start and end logits over the {mask.shape[1]} positions, "
                             f"got {tuple(logits.shape)}")
        return logits.masked_fill(~mask.to(logits.device).unsqueeze(1), torch.finfo(logits.dtype).min)
    if logits.dim() != expected or logits.shape[1] != mask.shape[1]:
        raise ValueError(f"output={kind!r} needs (B, T, V) logits over the {mask.shape[1]} positions, "
                         f"got {tuple(logits.shape)}")
    real = mask.to(logits.device)
    if kind == "last":
        positions = torch.arange(real.shape[1], device=real.device).expand_as(real)
        last = torch.where(real, positions, torch.full_like(positions, -1)).max(-1).values.clamp(min=0)
        return logits[torch.arange(logits.shape[0], device=logits.device), last]
    return logits.masked_fill(~real.unsqueeze(-1), 0.0)
