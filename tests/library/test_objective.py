import math

import pytest
import torch

from captum_diffmask import js_divergence, kl_divergence, LagrangeMultipliers
from captum_diffmask.diffmask.hard_concrete import HardConcrete
from captum_diffmask.diffmask.sparsity import l0_penalty, score_function_term
from captum_diffmask.model.divergences import log_probs


def test_kl_matches_direct_formula_and_is_zero_on_identity():
    torch.manual_seed(0)
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    p, q = a.softmax(-1), b.softmax(-1)
    direct = (p * (p.log() - q.log())).sum(-1)
    assert torch.allclose(kl_divergence(log_probs(a), log_probs(b)), direct, atol=1e-6)
    assert torch.allclose(kl_divergence(log_probs(a), log_probs(a)), torch.zeros(5), atol=1e-7)


def test_kl_with_zero_mass_has_no_nan():
    log_p = torch.tensor([[0.0, -math.inf]])  # p = (1, 0), e.g. a padded class
    log_q = torch.tensor([[math.log(0.5), math.log(0.5)]])
    value = kl_divergence(log_p, log_q)
    assert torch.isfinite(value).all() and value.item() == pytest.approx(math.log(2))


def test_js_is_symmetric_and_bounded():
    torch.manual_seed(0)
    a, b = log_probs(torch.randn(6, 3) * 5), log_probs(torch.randn(6, 3) * 5)
    assert torch.allclose(js_divergence(a, b), js_divergence(b, a), atol=1e-6)
    assert (js_divergence(a, b) <= math.log(2) + 1e-6).all()
    disjoint = js_divergence(torch.tensor([[0.0, -math.inf]]), torch.tensor([[-math.inf, 0.0]]))
    assert disjoint.item() == pytest.approx(math.log(2))


def test_binary_logit_becomes_bernoulli():
    lp = log_probs(torch.tensor([0.0, 2.0]))
    assert lp.shape == (2, 2)
    assert lp.exp()[1, 1].item() == pytest.approx(torch.sigmoid(torch.tensor(2.0)).item())


def test_l0_penalty_ignores_padding():
    log_keep = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[True, True, False]])
    assert l0_penalty(log_keep, mask).item() == pytest.approx(0.75)
    assert l0_penalty(log_keep, mask, "mean").item() == pytest.approx(0.75 / 2)
    assert l0_penalty(log_keep, mask, "log").item() == pytest.approx((math.log(0.5) + math.log(0.25)) / 2)
    with pytest.raises(ValueError, match="l0_penalty"):
        l0_penalty(log_keep, mask, "sum")


def test_lagrange_multiplier_ascends_when_violated_and_is_clamped():
    lambdas = LagrangeMultipliers(2)
    opt = lambdas.optimizer(lr=0.3)
    for violation, direction in [(1.0, 1), (-1.0, -1)]:
        before = lambdas(0).item()
        opt.zero_grad()
        (lambdas(0) * violation).backward()
        opt.step()
        lambdas.clamp_()
        assert (lambdas(0).item() - before) * direction > 0
        assert lambdas(1).item() == 1.0  # the other layer's multiplier is untouched
    for _ in range(50):
        opt.zero_grad()
        (lambdas(0) * -1.0).backward()
        opt.step()
        lambdas.clamp_()
    assert lambdas(0).item() == 0.0
    assert lambdas.values.dtype == torch.float32


def test_lagrange_multipliers_take_one_rate_per_layer():
    lambdas = LagrangeMultipliers(3)
    opt = lambdas.optimizer(lr=[0.5, 0.0, 2.0])
    violation = torch.tensor([0.2, 1.0, -0.1])
    opt.zero_grad()
    (lambdas() * violation).sum().backward()
    opt.step()
    # lambda_k += lr_k * (D_k - eps): 1 + 0.5 * 0.2, 1 + 0, 1 - 2 * 0.1
    assert lambdas().tolist() == pytest.approx([1.1, 1.0, 0.8])
    # equal rates: the same step as the single-rate optimizer
    single, per_layer = LagrangeMultipliers(3), LagrangeMultipliers(3)
    for multipliers, rate in [(single, 0.3), (per_layer, [0.3, 0.3, 0.3])]:
        opt = multipliers.optimizer(lr=rate)
        opt.zero_grad()
        (multipliers() * violation).sum().backward()
        opt.step()
    assert torch.allclose(single(), per_layer())
    with pytest.raises(ValueError, match="lr_lambda must be a float or 3 rates"):
        LagrangeMultipliers(3).optimizer(lr=[0.1, 0.2])
    with pytest.raises(ValueError, match="lr_lambda"):
        LagrangeMultipliers(3).optimizer(lr=[0.1, -0.2, 0.1])


def _violate(multipliers, opt, violation):
    opt.zero_grad()
    (multipliers() * torch.as_tensor(violation, dtype=torch.float32)).sum().backward()
    opt.step()
    multipliers.clamp_()


def test_damped_multiplier_rises_additively_and_decays_geometrically():
    lambdas = LagrangeMultipliers(3, init=2.0)
    opt = lambdas.optimizer(lr=[0.5, 0.5, 0.0], rule="damped", eps=0.1)
    # violated (c = 0.3): lambda += lr * c; layer 1 not trained (c = 0): unchanged;
    # layer 2 has rate 0: a fixed multiplier
    _violate(lambdas, opt, [0.3, 0.0, 0.3])
    assert lambdas().tolist() == pytest.approx([2.15, 2.0, 2.0])
    # slack by half of eps (c = -0.05): lambda *= exp(0.05 * -0.5)
    _violate(lambdas, opt, [-0.05, 0.0, -0.05])
    assert lambdas(0).item() == pytest.approx(2.15 * math.exp(-0.025), rel=1e-6)
    # slack by more than eps: at most exp(-0.05) a step, so a spike of 20 is back
    # under 1 within 61 steps (plain ascent at rate 0.5 needs 380 at c = -eps)
    spiked = LagrangeMultipliers(1, init=20.0)
    opt = spiked.optimizer(lr=0.5, rule="damped", eps=0.1)
    for _ in range(61):
        _violate(spiked, opt, [-1.0])
    assert spiked(0).item() == pytest.approx(20 * math.exp(-0.05 * 61), rel=1e-5)
    assert spiked(0).item() < 1.0


def test_multiplier_rule_and_decay_are_checked():
    with pytest.raises(ValueError, match="multiplier must be one of"):
        LagrangeMultipliers(2).optimizer(rule="pid")
    with pytest.raises(ValueError, match="decay must be >= 0"):
        LagrangeMultipliers(2).optimizer(rule="damped", decay=-1.0)


def test_the_score_function_term_is_zero_and_pushes_gates_toward_the_cheaper_event():
    # two examples, one gate each: example 0 sampled its gate closed and paid KL 2,
    # example 1 sampled it open and paid 0 (a step: the pathwise slope is 0 on both)
    logits = torch.tensor([[0.5], [0.5]], requires_grad=True)
    log_keep = HardConcrete(logits, 0.2, (-0.1, 1.1)).log_prob_nonzero()
    gates, kl, real = torch.tensor([[0.0], [1.0]]), torch.tensor([2.0, 0.0]), torch.ones(2, 1, dtype=torch.bool)
    term = score_function_term(kl, gates, log_keep, real)
    assert term.item() == 0.0
    term.backward()
    p = log_keep.detach().exp()
    # advantage +1 on the closed event, -1 on the open one, the mean over 2:
    # d/dlogit [log(1 - P)] = -P, d/dlogit [log P] = 1 - P
    expected = torch.stack([0.5 * 1.0 * -p[0], 0.5 * -1.0 * (1 - p[1])])
    assert torch.allclose(logits.grad, expected, atol=1e-6)
    assert (logits.grad < 0).all()  # descent raises both logits: both gates open


def test_the_score_function_term_ignores_padding_and_a_batch_of_one():
    logits = torch.zeros(2, 3, requires_grad=True)
    log_keep = HardConcrete(logits, 0.2, (-0.1, 1.1)).log_prob_nonzero()
    real = torch.tensor([[True, True, False], [True, True, False]])
    gates = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    score_function_term(torch.tensor([1.0, 0.0]), gates, log_keep, real).backward()
    assert (logits.grad[:, 2] == 0).all() and (logits.grad[:, :2] != 0).all()
    one = torch.zeros(1, 2, requires_grad=True)
    keep = HardConcrete(one, 0.2, (-0.1, 1.1)).log_prob_nonzero()
    score_function_term(torch.tensor([3.0]), torch.ones(1, 2), keep, torch.ones(1, 2)).backward()
    assert (one.grad == 0).all()
    # saturated gates stay finite
    near = torch.full((2, 1), 30.0, requires_grad=True)
    keep = HardConcrete(near, 0.2, (-0.1, 1.1)).log_prob_nonzero()
    score_function_term(torch.tensor([1.0, 0.0]), torch.tensor([[0.0], [1.0]]), keep, torch.ones(2, 1)).backward()
    assert torch.isfinite(near.grad).all()
