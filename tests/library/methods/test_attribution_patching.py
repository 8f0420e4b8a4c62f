"""Attribution patching: the first-order estimate of patching each head or unit,
checked against finite differences of the patched model and against a head
that writes nothing."""

import pytest
import torch

from captum_diffmask.model.components import gate_components
from captum_diffmask.methods import AttributionPatching
from captum_diffmask.model.divergences import log_probs

from tiny_models import sensitized, tiny_bert, tiny_causal_lm, token_batch


def _target_log_prob(model, ids, mask, site=None, gates=None, baselines=None, target=None):
    with torch.no_grad():
        if site is None:
            logits = model(input_ids=ids, attention_mask=mask).logits
        else:
            with gate_components([site], {site.name: gates}, baselines):
                logits = model(input_ids=ids, attention_mask=mask).logits
    return log_probs(logits).gather(-1, target.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("kind", ["heads", "units"])
def test_the_scores_are_the_derivative_of_patching_each_component(kind):
    model = sensitized(tiny_bert())
    ids, mask = token_batch(seed=3)
    method = AttributionPatching(model, kind=kind)
    baselines = method.fit_baselines([token_batch(seed=i) for i in range(2)])
    signed = method.attribute(ids, additional_forward_args=(mask,), absolute=False)
    count = method.components[0].count
    assert signed.shape == (ids.shape[0], 2, count)
    target = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    # central differences of F(g) around g = 1 for a few components of each block
    step = 1e-3
    for site in method.components:
        for index in range(0, count, max(1, count // 3)):
            values = []
            for g in (1 + step, 1 - step):
                gates = torch.ones(ids.shape[0], count)
                gates[:, index] = g
                values.append(_target_log_prob(model, ids, mask, site, gates, {site.name: baselines[site.layer]},
                                               target))
            derivative = (values[0] - values[1]) / (2 * step)
            assert torch.allclose(signed[:, site.layer - 1, index], derivative, atol=2e-3, rtol=2e-2), (site.name, index)
    assert torch.equal(method.attribute(ids, additional_forward_args=(mask,)), signed.abs())
    assert torch.equal(method.attribute(ids, additional_forward_args=(mask,), layer=2), signed[:, 1].abs())


def test_a_head_that_writes_nothing_scores_zero_and_the_target_is_honoured():
    model = sensitized(tiny_bert())
    with torch.no_grad():
        for block in model.bert.encoder.layer:
            block.attention.output.dense.weight[:, 16:] = 0
    ids, mask = token_batch(seed=4)
    method = AttributionPatching(model)
    scores = method.attribute(ids, additional_forward_args=(mask,))
    assert (scores[..., 1] == 0).all() and (scores[..., 0] > 1e-4).all()
    predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    other = method.attribute(ids, target=(predicted + 1) % 3, additional_forward_args=(mask,))
    assert not torch.allclose(other, scores) and torch.equal(
        method.attribute(ids, target=predicted, additional_forward_args=(mask,)), scores)


def test_a_causal_lm_and_bad_arguments():
    model = sensitized(tiny_causal_lm("llama"))
    ids, mask = token_batch(seed=5)
    method = AttributionPatching(model, kind="units")
    state = torch.get_rng_state()
    scores = method.attribute((ids,), additional_forward_args=(mask,), layer=1)
    assert isinstance(scores, tuple) and scores[0].shape == (ids.shape[0], method.components[0].count)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="layer"):
        method.attribute(ids, additional_forward_args=(mask,), layer=0)
    with pytest.raises(ValueError, match="kind"):
        AttributionPatching(model, kind="neurons")
    with pytest.raises(ValueError, match="data"):
        method.fit_baselines([])
