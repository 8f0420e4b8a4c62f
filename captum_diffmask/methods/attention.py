"""The attention baseline of the paper's per-layer figures: how much attention
each token receives at block k."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import check_layer, ForwardFunc, InputType, PaddingMaskArg, reject_target
from captum_diffmask.model.attribution import attribution_call, SiteAttribution, SitesType
from captum_diffmask.model.forward import frozen, is_hf_model


def received_attention(attentions: Tuple[Tensor, ...], mask: Tensor) -> Tensor:
    r"""
    The attention each key token receives at each block, max over heads and
    mean over the real query positions:
    ``a[t, l] = mean_{q real} max_h A^(l)[h, q, t]``.

    Args:

        attentions (tuple of Tensor): one (B, heads, T, T) tensor per block, as
                    a Hugging Face model returns them with ``output_attentions``.
        mask (Tensor): (B, T), nonzero at real tokens.

    Returns:
        *Tensor* (B, T, L) float32, >= 0, 0 at padding; ``[..., l]`` is block
        ``l + 1``.
    """
    real = mask.to(attentions[0].dtype)
    count = real.sum(1).clamp(min=1.0).view(-1, 1)
    blocks = []
    for weights in attentions:
        strongest = weights.amax(1)  # (B, T_query, T_key)
        received = torch.einsum("bqt,bq->bt", strongest, real) / count
        blocks.append(received * real)
    return torch.stack(blocks, -1).float()


@register_method
class AttentionWeights(SiteAttribution):
    r"""
    Attention weights as an attribution (the paper's attention baseline): at
    layer k (1..L) the attention each token receives in block k, max over the
    heads and mean over the real query positions; ``layer=None`` gives every
    block. Layer 0, the token embeddings, has no attention: it is refused.

    The model runs once, without gradients, with ``output_attentions=True``:
    a Hugging Face model whose attention returns its weights (load it with
    ``attn_implementation="eager"``; SDPA and flash attention return none).

    Args:

        model (nn.Module): a Hugging Face model.
        sites, forward_func, padding_mask_arg, output: as every method's
                    (:class:`~captum_diffmask.model.attribution.SiteAttribution`);
                    a ``forward_func`` is refused (the weights come from the
                    model's own output).
    """

    label = "Attention"
    summary = "attention weights: what each token receives at block k (max over heads, mean over queries)"
    uses_target = False

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
    ) -> None:
        if forward_func is not None or not is_hf_model(model):
            raise ValueError("model: attention weights are read from a Hugging Face model's own output "
                             "(output_attentions=True), called without a forward_func")
        super().__init__(model, sites, forward_func, padding_mask_arg, output)

    def _site(self, layer: Any) -> Optional[str]:
        r"""The block's output ``hidden.k`` whose attention is read (1..L), or
        None for every block; layer 0 has no attention."""
        if check_layer(layer, self.num_layers, allow_none=True) is None:
            return None
        if layer == 0:
            raise ValueError(f"layer: attention weights exist at the blocks 1..{self.num_layers}, not at the "
                             "token embeddings (layer 0); pass a block, or None for every block")
        return f"hidden.{layer}"

    def attributes_every_layer(self) -> bool:
        r"""True: ``attribute(layer=None)`` gives (B, T, L), one column per block."""
        return True

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: Optional[int] = None,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        The attention each token receives.

        Args:

            inputs, additional_forward_args: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target: must be None (the weights do not depend on a class).
                        Default: None
            layer (int, optional): the block, 1..L; None for every block.
                        Default: None

        Returns:
            *Tensor* (B, T) for a block, (B, T, L) for ``layer=None``; >= 0, 0 at
            padding (a 1-tuple if ``inputs`` was).
        """
        reject_target(target, "Attention", "nothing of the output (the weights do not depend on a class)")
        call = self._prepare(inputs, additional_forward_args, layer)
        with torch.no_grad(), frozen(self.model):
            output = self.model(input_ids=call.ids, attention_mask=call.mask.long(), output_attentions=True)
        attentions = getattr(output, "attentions", None)
        if not attentions or any(a is None for a in attentions):
            raise ValueError("model: it returned no attention weights; load it with attn_implementation=\"eager\" "
                             "(SDPA and flash attention do not return them)")
        scores = received_attention(tuple(attentions), call.mask)
        return self._finish(scores if layer is None else scores[..., layer - 1], call)
