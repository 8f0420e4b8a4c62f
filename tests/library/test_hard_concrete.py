import math

import pytest
import torch

from captum_diffmask import HardConcrete
from captum_diffmask.diffmask.hard_concrete import LOUIZOS_DEFAULTS


LOGITS = torch.tensor([-4.0, -1.0, 0.0, 1.5, 4.0])


@pytest.mark.parametrize("temperature,low,high", [(0.2, -0.2, 1.0), LOUIZOS_DEFAULTS])
def test_monte_carlo_prob_nonzero_matches_closed_form(temperature, low, high):
    torch.manual_seed(0)
    dist = HardConcrete(LOGITS, temperature, (low, high))
    samples = dist.rsample(torch.Size([200_000]))
    monte_carlo = (samples > 0).float().mean(0)
    assert torch.allclose(monte_carlo, dist.prob_nonzero(), atol=0.01)
    # the closed form is also log P(s > -l/(r-l)) of the underlying Binary Concrete
    expected = torch.sigmoid(LOGITS - temperature * math.log(-low / high))
    assert torch.allclose(dist.log_prob_nonzero().exp(), expected, atol=1e-6)


def test_authors_offset_is_0_2_ln5():
    dist = HardConcrete(torch.zeros(1))
    assert dist.offset == pytest.approx(0.2 * math.log(5.0))
    assert dist.prob_nonzero().item() == pytest.approx(torch.sigmoid(torch.tensor(0.3219)).item(), abs=1e-4)


def test_samples_lie_in_half_open_unit_interval_with_mass_at_zero():
    torch.manual_seed(0)
    samples = HardConcrete(torch.zeros(100_000)).rsample()
    assert samples.min() >= 0.0 and samples.max() < 1.0  # r = 1: no mass at 1
    assert (samples == 0).float().mean() == pytest.approx(1 - 0.5798, abs=0.01)
    # Louizos' stretch reaches past 1 and has mass at 1 too
    louizos = HardConcrete(torch.zeros(100_000), *[LOUIZOS_DEFAULTS[0], LOUIZOS_DEFAULTS[1:]]).rsample()
    assert (louizos == 1).float().mean() > 0.1


def test_gradients_reach_logits():
    logits = torch.zeros(1000, requires_grad=True)
    dist = HardConcrete(logits)
    (dist.rsample().sum() + dist.log_prob_nonzero().sum()).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    # larger logits open gates: the mean sample grows with the logits
    torch.manual_seed(1)
    low = HardConcrete(torch.full((20000,), -1.0)).rsample().mean()
    high = HardConcrete(torch.full((20000,), 1.0)).rsample().mean()
    assert high > low + 0.2


def test_large_logits_do_not_saturate():
    logits = torch.tensor([30.0, -30.0], requires_grad=True)
    log_p = HardConcrete(logits).log_prob_nonzero()
    assert torch.isfinite(log_p).all()
    log_p.sum().backward()
    assert logits.grad[1] > 0  # still a gradient at -30 (RelaxedBernoulli clamps it away)


def test_deterministic_gates():
    dist = HardConcrete(torch.tensor([-3.0, -0.1, 0.0, 3.0]))
    assert dist.deterministic_gate().tolist() == [0.0, 1.0, 1.0, 1.0]  # P > 0.5 from -0.32 up
    louizos = dist.deterministic_gate("louizos")
    assert louizos[0] == 0 and 0 < louizos[2] < 1 and louizos[3] <= 1
    with pytest.raises(ValueError, match="rule"):
        dist.deterministic_gate("nope")


def test_bad_parameters():
    with pytest.raises(ValueError, match="temperature"):
        HardConcrete(torch.zeros(1), temperature=0.0)
    with pytest.raises(ValueError, match="stretch"):
        HardConcrete(torch.zeros(1), stretch=(0.1, 1.0))
    with pytest.raises(TypeError, match="logits"):
        HardConcrete([0.0])


def test_with_prob_nonzero_is_the_gate_with_that_keep_probability():
    from captum_diffmask.diffmask.hard_concrete import HardConcrete as HC

    votes = torch.tensor([[5.0, 2.0, -1.0], [15.0, 15.0, 15.0], [0.0, 0.3, 4.0]], requires_grad=True)
    log_keep = HC(votes).log_prob_nonzero().sum(-1)  # every vote non-zero
    joint = HC.with_prob_nonzero(log_keep)
    assert torch.allclose(joint.log_prob_nonzero(), log_keep, atol=1e-5)
    assert torch.isfinite(joint.logits).all()  # three saturated votes: P within float32's reach of 1
    torch.manual_seed(0)
    samples = joint.rsample(torch.Size([20000]))
    assert torch.allclose((samples > 0).float().mean(0), log_keep.exp().detach(), atol=0.02)
    samples.sum().backward()
    assert torch.isfinite(votes.grad).all() and votes.grad.abs().sum() > 0


def test_the_floored_l0_keeps_its_value_and_gives_open_gates_at_least_the_floor():
    logits = torch.tensor([-8.0, -1.0, 0.0, 2.0, 15.0], requires_grad=True)
    gate = HardConcrete(logits)
    floored = gate.log_prob_nonzero_floored(0.05)
    assert torch.allclose(floored, gate.log_prob_nonzero())
    (grad,) = torch.autograd.grad(floored.exp().sum(), logits)
    p = gate.prob_nonzero().detach()
    plain = p * (1 - p)
    is_open = p > 0.5
    # open gates: max(P (1 - P), floor); closed ones: the plain gradient, untouched
    assert torch.allclose(grad[is_open], plain[is_open].clamp(min=0.05), rtol=1e-5)
    assert torch.allclose(grad[~is_open], plain[~is_open], rtol=1e-5)
    assert grad[-1] == pytest.approx(0.05, rel=1e-4) and plain[-1] < 1e-5  # saturated open: the floor
    # floor 0 is the plain log-probability, gradient included
    (zero,) = torch.autograd.grad(gate.log_prob_nonzero_floored(0.0).exp().sum(), logits)
    assert torch.allclose(zero, plain, atol=1e-6)
