"""The attention baseline of the paper's per-layer figures."""

from __future__ import annotations


import torch
import torch.nn as nn
from torch import Tensor



@torch.no_grad()
def attention_attributions(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    r"""
    The attention baseline of the paper's per-layer figures: for every layer
    ``l`` and key token ``t``, the attention ``t`` receives, max over heads and
    mean over the real query positions,

    .. math::
        a_{t,l} = \frac{1}{|Q|} \sum_{q \in Q} \max_h A^{(l)}_{h,q,t},

    with ``Q`` the real (non-padding) tokens of the row and 0 at padding.

    The model runs once in eval mode (no attention dropout; its mode is
    restored) with ``output_attentions=True``, which needs eager attention
    (:func:`load_minilm` and :func:`tiny_bert` use it).

    Args:

        model (nn.Module): a Hugging Face BERT-family model.
        ids (Tensor): (B, T) long token ids.
        mask (Tensor): (B, T) attention mask, nonzero at real tokens.

    Returns:
        *Tensor* (B, T, L) float, >= 0, 0 at padding, with ``L`` the number of
        layers (``[..., l]`` is block ``l + 1``).

    Raises:
        ValueError: the model returns no attention weights (e.g. SDPA attention:
                    load it with ``attn_implementation="eager"``).
    """
    was_training = model.training
    model.eval()
    try:
        output = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    finally:
        model.train(was_training)
    attentions = getattr(output, "attentions", None)
    if not attentions or any(a is None for a in attentions):
        raise ValueError(
            "the model returned no attention weights; load it with attn_implementation=\"eager\" "
            "(SDPA and flash attention do not return them)"
        )
    real = mask.to(attentions[0].dtype)  # (B, T)
    count = real.sum(1).clamp(min=1.0).view(-1, 1)
    layers = []
    for a in attentions:  # (B, H, T_query, T_key)
        heads_max = a.amax(1)  # (B, T_query, T_key)
        received = torch.einsum("bqt,bq->bt", heads_max, real) / count
        layers.append(received * real)  # padding keys: 0
    return torch.stack(layers, -1).float()
