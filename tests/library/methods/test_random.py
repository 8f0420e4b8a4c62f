"""The chance reference: uniform scores at real positions from a private generator."""

import pytest
import torch

from captum_diffmask.methods.random import random_attribution, RandomAttribution

from tiny_models import tiny_bert, token_batch


def test_random_attribution_function():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    scores = random_attribution(mask, seed=3)
    assert scores.shape == (2, 4) and torch.all(scores[~mask] == 0) and torch.all((scores[mask] >= 0) & (scores[mask] < 1))
    assert torch.equal(scores, random_attribution(mask, seed=3))
    assert not torch.equal(scores, random_attribution(mask, seed=4))
    with pytest.raises(ValueError, match="mask"):
        random_attribution(torch.ones(3, dtype=torch.bool))


def test_random_attribution_method_repeats_differs_and_keeps_the_global_rng():
    ids, mask = token_batch()
    method = RandomAttribution(tiny_bert(), seed=0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = method.attribute(ids, additional_forward_args=(mask,))
    second = method.attribute(ids, additional_forward_args=(mask,))
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(first, second) and (first[mask == 0] == 0).all()
    assert torch.equal(first, RandomAttribution(tiny_bert(), seed=0).attribute(ids, additional_forward_args=(mask,)))
    with pytest.raises(ValueError, match="target"):
        method.attribute(ids, target=1, additional_forward_args=(mask,))
