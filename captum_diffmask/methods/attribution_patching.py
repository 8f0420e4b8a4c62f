"""Attribution patching (Nanda 2023; Syed, Rager and Conmy 2023): the first-order
estimate of what patching each attention head or MLP unit would do to the output,
from one forward and one backward pass."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Union

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.probes import masked_mean
from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import (
    check_layer, ForwardFunc, InputType, PaddingMaskArg, PreparedCall, resolve_target,
)
from captum_diffmask.model.attribution import attribution_call, SiteAttribution, SitesType
from captum_diffmask.model.components import ComponentSite, gate_components, locate_components, read_components
from captum_diffmask.model.divergences import log_probs
from captum_diffmask.model.forward import Batch, frozen


@register_method
class AttributionPatching(SiteAttribution):
    r"""
    The gradient baseline of the component masks: for every head (or MLP unit) of
    every block and every input, the first-order estimate of how much the target's
    log-probability drops when the component's output ``c`` is replaced by a
    baseline ``b``.

    Objective: none (no optimisation). With ``F`` the target's log-probability
    (summed over the distributions of a model with several per example), the
    model is run with every component mixed as ``g * c + (1 - g) * b`` at
    ``g = 1`` (the model itself), and the score of a component is
    ``dF / dg = (c - b) . dF / dc``, summed over positions and the component's
    features: patching it (``g`` from 1 to 0) changes ``F`` by about ``-dF/dg``.
    Every component is scored from the same two passes, all paths through the
    later blocks included.

    The KL that DiffMask constrains has no first-order term at the model itself
    (its gradient there is zero), so the target's log-probability stands in,
    as in attribution patching on a task metric.

    Cost: one forward and one backward pass per batch.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and
                    how to call it, as in :class:`SiteAttribution`.
        kind (str, optional): ``"heads"`` or ``"units"``. Default: ``"heads"``
    """

    summary = "Nanda 2023, Syed et al. 2023: activation x gradient of patching each head or MLP unit"
    needs_data = False

    def __init__(
        self, model: nn.Module, kind: str = "heads", sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output)
        self.kind = kind
        #: the scored components of blocks 1..L
        self.components: List[ComponentSite] = locate_components(model, kind, self.locator)
        #: block -> (count, width) baseline set by :meth:`fit_baselines`; zeros where missing
        self.baselines: Dict[int, Tensor] = {}

    def _site(self, layer: Any) -> Optional[str]:
        if check_layer(layer, self.num_layers, allow_none=True) is None:
            return None
        if layer < 1:
            raise ValueError(f"layer: components are in blocks 1..{self.num_layers} (layer k: the block whose "
                             f"output is hidden.k), got {layer}")
        return f"{self.kind}.{layer}"

    @torch.no_grad()
    def fit_baselines(self, data: Iterable[Batch], batches: Optional[int] = None) -> Dict[int, Tensor]:
        r"""
        Sets each component's baseline to its mean over the real positions of
        ``data`` (mean ablation; zero ablation without this call).

        Args:

            data (iterable): batches as :meth:`DiffMask.fit` takes them.
            batches (int, optional): read at most this many batches. Default: None

        Returns:
            *dict* block -> (count, width) baselines.
        """
        sums: Dict[int, Tensor] = {}
        count = 0.0
        with frozen(self.model):
            for index, batch in enumerate(data):
                if batches is not None and index >= batches:
                    break
                call = self.prepare_batch(batch, None, "data batch")
                with read_components(self.components) as seen:
                    self.model_forward(call.ids, call.extra)
                real = float(call.mask.sum())
                for site in self.components:
                    mean = masked_mean(seen[site.name], call.mask)
                    sums[site.layer] = sums.get(site.layer, torch.zeros_like(mean)) + mean * real
                count += real
        if not count:
            raise ValueError("data: no real tokens to take the components' mean over")
        self.baselines = {layer: total / count for layer, total in sums.items()}
        return dict(self.baselines)

    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: Optional[int] = None, absolute: bool = True,
    ) -> Union[Tensor, tuple]:
        r"""
        The estimated drop of the target's log-probability when each component
        is patched by its baseline.

        Args:

            inputs, additional_forward_args: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target (optional): the class (per distribution) whose
                        log-probability is read; None = the predicted one.
                        Default: None
            layer (int, optional): block k (1..L), or None for every block.
                        Default: None
            absolute (bool, optional): the size of the estimate (how much
                        patching moves the output, either way), else its sign
                        too (positive: the target's log-probability drops).
                        Default: True

        Returns:
            *Tensor* (or a 1-tuple, when ``inputs`` is a tuple): (B, count) for
            a block, (B, L, count) for ``layer=None``, one score per input.
        """
        call = self._prepare(inputs, additional_forward_args, layer)
        scores = self._gate_gradients(call, target)
        chosen = torch.stack(scores, 1) if layer is None else scores[layer - 1]
        return self._finish_per_input(chosen.abs() if absolute else chosen, call)

    def _gate_gradients(self, call: PreparedCall, target: Any) -> List[Tensor]:
        r"""``dF/dg`` at ``g = 1`` for every block, each (B, count)."""
        batch = call.ids.shape[0]
        gates = {site.name: torch.ones(batch, site.count, device=call.ids.device, requires_grad=True)
                 for site in self.components}
        baselines = {site.name: self.baselines[site.layer] for site in self.components if site.layer in self.baselines}
        with frozen(self.model), torch.enable_grad(), gate_components(self.components, gates, baselines):
            logits = self.replaced_logits(call, {})
            targets = resolve_target(logits.detach(), target)
            if targets is None:  # one binary logit: the logit itself
                objective = logits.reshape(-1).sum()
            else:
                read = log_probs(logits).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                objective = read.reshape(batch, -1).sum()
            grads = torch.autograd.grad(objective, [gates[site.name] for site in self.components])
        return [g.detach() for g in grads]
