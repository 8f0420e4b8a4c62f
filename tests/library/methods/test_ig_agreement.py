"""Our Integrated Gradients against implementations of the same definition that
it does not share code with: Captum's ``LayerIntegratedGradients`` (hooks on the
embedding layer, where ours replaces the site's output) and a plain torch
quadrature through the model's ``inputs_embeds`` (no Captum at all).

The input site is the word embeddings' output; a config-built BERT's padding row
is zero, so baseline ids of 0 give Captum the zero baseline ours uses."""

from __future__ import annotations

import pytest
import torch
from captum.attr import LayerIntegratedGradients

from captum_diffmask.methods import IntegratedGradients
from tiny_models import tiny_bert, token_batch

#: the largest difference allowed: float32 sums of 16 or 20 gradient evaluations
TOLERANCE = 1e-5
TARGET = 1


def _ours(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, **options) -> torch.Tensor:
    method = IntegratedGradients(model, reduction="sum", **options)
    return method.attribute(ids, target=TARGET, additional_forward_args=(mask,), layer=0)


def test_the_same_as_captums_layer_integrated_gradients_at_the_word_embeddings() -> None:
    model = tiny_bert()
    ids, mask = token_batch()
    embeddings = model.bert.embeddings.word_embeddings
    assert bool((embeddings.weight[0] == 0).all())  # the padding row: baseline ids 0 are a zero baseline
    ours = _ours(model, ids, mask, n_steps=16, baselines=0.0)  # the default rule, Gauss-Legendre

    def logits(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    layer_ig = LayerIntegratedGradients(logits, embeddings)
    theirs = layer_ig.attribute(ids, baselines=torch.zeros_like(ids), target=TARGET, additional_forward_args=(mask,),
                                n_steps=16, method="gausslegendre").sum(-1) * mask
    assert (ours - theirs).abs().max() <= TOLERANCE
    assert ours.abs().max() > 100 * TOLERANCE  # not two zeros


@pytest.mark.parametrize("n_steps", [2, 20])
def test_the_composite_trapezoid_rule_computed_by_hand(n_steps: int) -> None:
    model = tiny_bert()
    ids, mask = token_batch()
    ours = _ours(model, ids, mask, n_steps=n_steps, method="riemann_trapezoid", baselines=0.0)  # the authors' rule
    words = model.bert.embeddings.word_embeddings(ids).detach()
    weights = torch.full((n_steps,), 1.0 / (n_steps - 1))
    weights[0] = weights[-1] = 0.5 / (n_steps - 1)  # the composite trapezoid rule on [0, 1]
    total = torch.zeros_like(words)
    for alpha, weight in zip(torch.linspace(0, 1, n_steps), weights):
        point = (alpha * words).requires_grad_(True)  # the path from the zero baseline
        output = model(inputs_embeds=point, attention_mask=mask).logits[:, TARGET].sum()
        (gradient,) = torch.autograd.grad(output, point)
        total += weight * gradient
    by_hand = (words * total).sum(-1) * mask
    assert (ours - by_hand).abs().max() <= TOLERANCE
