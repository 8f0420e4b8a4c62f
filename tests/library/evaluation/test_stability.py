"""Stability across seeds: seed_std's numbers and fit_stability on a tiny BERT."""

import math

import pytest
import torch

from captum_diffmask import DiffMask, fit_stability, seed_std
from tiny_models import tiny_bert, token_batch


def test_seed_std_per_layer_and_overall_leaves_padding_out():
    a = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [5.0, 5.0]]])  # (B=1, T=3, K=2); position 2 is padding
    b = torch.tensor([[[1.0, 1.0], [1.0, 0.0], [-5.0, 9.0]]])
    mask = torch.tensor([[True, True, False]])
    result = seed_std([a, b], mask)
    s = math.sqrt(0.5)  # sample std of {0, 1}
    assert result["per_layer"][0] == {"layer": 0, "mean_std": pytest.approx(s / 2), "p95_std": pytest.approx(0.95 * s)}
    assert result["per_layer"][1]["mean_std"] == pytest.approx(s / 2)
    assert result["mean_std"] == pytest.approx(s / 2) and result["max_std"] == pytest.approx(s)
    assert result["seeds"] == 2
    # one layer, (B, T): a single entry with layer None; identical seeds: 0
    same = seed_std([a[..., 0], a[..., 0]])
    assert same["per_layer"] == [{"layer": None, "mean_std": 0.0, "p95_std": 0.0}]


def test_seed_std_refuses_what_it_cannot_compare():
    a = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="per_seed: .*two seeds"):
        seed_std([a])
    with pytest.raises(ValueError, match="per_seed: .*one shape"):
        seed_std([a, torch.zeros(2, 4)])
    with pytest.raises(ValueError, match="mask: expected shape"):
        seed_std([a, a], torch.ones(3, 3, dtype=torch.bool))


def test_fit_stability_matches_its_fits_and_leaves_the_rng_as_found():
    model = tiny_bert()
    ids, mask = token_batch(batch=6, length=7, seed=1)
    loader = [(ids, mask)] * 3
    before = torch.get_rng_state()
    result = fit_stability(model, loader, ids, additional_forward_args=(mask,), seeds=[0, 1],
                           explainer_options={"mode": "hidden"}, fit_options={"epochs": 2, "eps": 0.05})
    assert torch.equal(torch.get_rng_state(), before)
    L = model.config.num_hidden_layers
    assert result["attributions"].shape == (2, 6, 7, L + 1)
    assert len(result["per_layer"]) == L + 1 and len(result["convergence"]) == 2
    # the same fits by hand give the same attributions, hence the same figures
    by_hand = []
    for seed in (0, 1):
        dm = DiffMask(model, mode="hidden")
        dm.fit(loader, epochs=2, eps=0.05, seed=seed, verbose=False)
        by_hand.append(dm.attribute(ids, additional_forward_args=(mask,), layer=None))
    assert torch.allclose(result["attributions"], torch.stack(by_hand))
    assert result["mean_std"] == pytest.approx(seed_std(by_hand, mask.bool())["mean_std"])
    assert result["mean_std"] > 0  # two seeds, two different probes
    with pytest.raises(ValueError, match="seeds: at least two different"):
        fit_stability(model, loader, ids, additional_forward_args=(mask,), seeds=[3, 3])


def test_the_swap_test_scores_each_fits_mask_and_compares_them_position_by_position():
    import copy
    import warnings

    from captum_diffmask import swap_test

    model = tiny_bert()
    ids, mask = token_batch(batch=6, length=7, seed=1)
    batches = [(ids, mask)]
    first = DiffMask(model, mode="hidden")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.fit(batches * 3, layers=[1, 2], max_steps=5, seed=0, verbose=False)
    other = copy.deepcopy(first)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # another fit's probe: the same gates' networks, moved
        for parameter in other.probe.parameters():
            parameter.add_(2.0 * torch.randn(parameter.shape, generator=generator))

    itself = swap_test([first, first], batches)
    assert all(p["disagreement"] == 0.0 and p["masked_gap"] == 0.0 and p["kl_gap"] == 0.0 for p in itself["pairs"])
    result = swap_test([first, other], batches)
    assert result["layers"] == [1, 2] and len(result["pairs"]) == 2
    real = mask.bool()
    for pair in result["pairs"]:
        k = pair["layer"]
        kept = [e.attribute(ids, additional_forward_args=(mask,), layer=k) > 0.5 for e in (first, other)]
        assert pair["disagreement"] == pytest.approx(float(((kept[0] != kept[1]) & real).sum()) / float(real.sum()))
        masked = [1.0 - float((m & real).sum()) / float(real.sum()) for m in kept]
        assert [result["fits"][i][str(k)]["masked"] for i in (0, 1)] == pytest.approx(masked)
        assert pair["masked_gap"] == pytest.approx(abs(masked[0] - masked[1]))
    assert max(p["disagreement"] for p in result["pairs"]) > 0.1  # the moved probe keeps other positions
    with pytest.raises(ValueError, match="at least two fits"):
        swap_test([first], batches)
