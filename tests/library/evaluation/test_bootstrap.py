"""The paired bootstrap on synthetic scores with a known difference."""

import pytest
import torch

from captum_diffmask.evaluation import paired_bootstrap


def _pair(n, shift, seed, shared_sd=1.0, noise_sd=0.2):
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(n, generator=g, dtype=torch.float64) * shared_sd  # what both methods share per example
    return common + shift + noise_sd * torch.randn(n, generator=g, dtype=torch.float64), common


def test_a_known_difference_is_inside_the_interval_and_zero_is_outside():
    first, second = _pair(400, 0.1, seed=0)
    result = paired_bootstrap(first, second, resamples=4000)
    assert result["low"] < 0.1 < result["high"] and result["low"] > 0
    assert result["difference"] == pytest.approx(float((first - second).mean()))
    # the pairing matters: the shared per-example part (sd 1) cancels; unpaired it would swamp 0.1
    assert result["high"] - result["low"] < 0.06


def test_no_difference_gives_an_interval_around_zero():
    first, second = _pair(400, 0.0, seed=1)
    result = paired_bootstrap(first, second, resamples=4000)
    assert result["low"] < 0 < result["high"]


def test_the_interval_covers_the_true_difference_about_95_percent_of_the_time():
    covered = 0
    for seed in range(200):
        first, second = _pair(60, 0.3, seed=seed)
        result = paired_bootstrap(first, second, resamples=1000, seed=seed)
        covered += result["low"] <= 0.3 <= result["high"]
    # binomial(200, ~0.94) (the percentile bootstrap under-covers a little at n = 60): 0.88-0.99
    assert 176 <= covered <= 199


def test_the_same_seed_gives_the_same_interval_and_the_global_rng_is_untouched():
    first, second = _pair(50, 0.2, seed=3)
    state = torch.get_rng_state()
    assert paired_bootstrap(first, second, resamples=500, seed=7) == paired_bootstrap(first, second, resamples=500,
                                                                                      seed=7)
    assert torch.equal(state, torch.get_rng_state())


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(ValueError, match="resamples"):
        paired_bootstrap([1.0], [1.0], resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1.0], [1.0], confidence=1.0)
