"""The chance reference: scores that know nothing about the model."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import ForwardFunc, InputType, PaddingMaskArg, reject_target
from captum_diffmask.model.attribution import attribution_call, SiteAttribution, SitesType


def random_attribution(mask: Tensor, seed: Optional[int] = None, generator: Optional[torch.Generator] = None) -> Tensor:
    r"""
    The chance reference: independent uniform scores in [0, 1) per real position.

    Scoring it the same way as a method shows what an attribution that knows
    nothing about the model gets (it is what any divergence to a ground truth
    must beat to mean something).

    Args:

        mask (Tensor): (B, T), True (or 1) at real tokens.
        seed (int, optional): seeds a private generator (the global RNG is not
                    touched). Default: None (the global RNG, or ``generator``)
        generator (torch.Generator, optional): used when ``seed`` is None, so that
                    successive calls draw different scores. Default: None

    Returns:
        *Tensor* (B, T) float32, uniform in [0, 1) at real positions, 0 at padding.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ValueError(f"mask must be a (B, T) Tensor, got {getattr(mask, 'shape', type(mask).__name__)}")
    if seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    scores = torch.rand(mask.shape, generator=generator)
    return scores.to(mask.device) * mask.bool().float()


@register_method
class RandomAttribution(SiteAttribution):
    r"""
    Independent uniform scores in [0, 1) at the real positions, 0 at padding:
    what any attribution must beat to mean something. Drawn from the instance's
    own generator, so successive calls differ, a run repeats, and the global RNG
    is not touched. The model is never run; it is read for its padding
    convention and, as every method's, its sites (``layer`` is checked against
    them; the scores do not depend on it).

    Args:

        model (nn.Module): the analysed model.
        sites, forward_func, padding_mask_arg, output: as every method's
                    (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
        seed (int, optional): seeds the generator. Default: 0
    """

    label = "Random"
    summary = "uniform random scores: the chance reference"
    uses_target = False
    uses_baselines = False

    def __init__(
        self,
        model: nn.Module,
        sites: SitesType = None,
        forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto",
        output: str = "auto",
        seed: int = 0,
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output)
        self.generator = torch.Generator().manual_seed(int(seed))

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: int = 0,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        Draws uniform scores for the real tokens from the method's own generator
        (the global RNG is not touched).

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`);
                        only the padding mask is read, and the scores do not
                        depend on ``layer``.
            target: must be None (the scores preserve nothing). Default: None

        Returns:
            *Tensor* (B, T) in [0, 1), 0 at padding (a 1-tuple if ``inputs`` was),
            on the device of the inputs.
        """
        reject_target(target, "RandomAttribution", "nothing")
        call = self._prepare(inputs, additional_forward_args, layer)
        return self._finish(random_attribution(call.mask, generator=self.generator), call)
