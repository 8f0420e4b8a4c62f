"""The "pi" multiplier rule: a PI controller on each layer's smoothed divergence."""

import math
import random

import pytest
import torch

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.pi_control import PIMultiplierControl
from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers


def _plant(lam: float, scale: float, rng: random.Random) -> float:
    r"""A layer whose batch KL falls as the multiplier rises: the gates the probe
    keeps open grow with lambda (KL = scale / lambda on average), with
    heavy-tailed batch noise (a sample now and then masks something needed)."""
    kl = scale / max(lam, 1e-6)
    noise = rng.expovariate(1.0)  # mean 1, long right tail
    return kl * noise


def _run_pi(scale: float, eps: float, steps: int = 6000, seed: int = 0):
    rng = random.Random(seed)
    lambdas = LagrangeMultipliers(1)
    control = PIMultiplierControl(lambdas, KLConstraint(eps), lr=0.01, kp=50.0, max_error=3.0, floor=0.01)
    observed, lams = [], []
    for _ in range(steps):
        kl = _plant(float(lambdas.values[0].detach()), scale, rng)
        control.step({0: kl})
        observed.append(kl)
        lams.append(float(lambdas.values[0].detach()))
    return sum(observed[-2000:]) / 2000, sum(lams[-2000:]) / 2000


@pytest.mark.parametrize("scale", [0.001, 0.1, 0.5])
def test_settles_where_the_mean_divergence_is_eps_whatever_the_multipliers_scale(scale):
    eps = 0.01
    mean_kl, mean_lam = _run_pi(scale, eps)
    # the plant's equilibrium is lambda* = scale / eps: 0.1, 10 and 50
    assert mean_kl == pytest.approx(eps, rel=0.15)
    assert mean_lam == pytest.approx(scale / eps, rel=0.3)


def test_the_damped_rule_settles_above_eps_on_the_same_plant_at_a_large_multiplier():
    """What the controller is for: the damped rule's additive rise and relative
    fall balance only near lambda = lr * eps / decay, above it the KL settles
    above eps (docs/guide/diffmask.md, "Convergence")."""
    rng = random.Random(0)
    lambdas = LagrangeMultipliers(1)
    optimizer = lambdas.optimizer(1.0, rule="damped", eps=0.01)
    observed = []
    for _ in range(6000):
        kl = _plant(float(lambdas.values[0].detach()), 0.1, rng)
        lambdas.values.grad = torch.tensor([kl - 0.01])
        optimizer.step()
        lambdas.clamp_()
        observed.append(kl)
    damped = sum(observed[-2000:]) / 2000
    pi, _ = _run_pi(0.1, 0.01)
    assert damped > 1.3 * 0.01 and abs(pi - 0.01) < abs(damped - 0.01) / 3


def test_a_spike_is_bounded_by_max_error_and_the_smoothing():
    lambdas = LagrangeMultipliers(1, init=2.0)
    control = PIMultiplierControl(lambdas, KLConstraint(0.01), lr=0.01, kp=0.0, max_error=3.0, smoothing=0.9)
    control.step({0: 0.01})  # at eps: no move
    assert float(lambdas.values[0].detach()) == pytest.approx(2.0)
    control.step({0: 10.0})  # a KL 1000x eps: the estimate moves by a tenth, the error is capped at 3
    assert control.estimates[0] == pytest.approx(0.9 * 0.01 + 0.1 * 10.0)
    assert control.error(0) == 3.0
    assert float(lambdas.values[0].detach()) == pytest.approx(2.0 * math.exp(0.01 * 3.0), rel=1e-5)


def test_layers_not_in_a_step_do_not_move():
    lambdas = LagrangeMultipliers(3, init=1.0)
    control = PIMultiplierControl(lambdas, KLConstraint(0.1), lr=0.1)
    for _ in range(5):
        control.step({1: 0.0})
    assert float(lambdas.values[0].detach()) == 1.0 and float(lambdas.values[2]) == 1.0
    assert float(lambdas.values[1]) < 1.0
    assert control.estimates == [None, 0.0, None]


def test_per_layer_rates_and_the_floor_and_the_clamp():
    lambdas = LagrangeMultipliers(2, init=1.0, max_value=5.0)
    control = PIMultiplierControl(lambdas, KLConstraint(0.1), lr=[0.5, 0.0], kp=0.0, floor=0.01)
    for _ in range(50):
        control.step({0: 0.0, 1: 0.0})  # slack: falls to the floor, rate 0 stays
    assert float(lambdas.values[0].detach()) == pytest.approx(0.01) and float(lambdas.values[1]) == pytest.approx(1.0)
    for _ in range(50):
        control.step({0: 5.0, 1: 5.0})  # violated: rises to the clamp
    assert float(lambdas.values[0].detach()) == pytest.approx(5.0)


def test_state_round_trip_continues_identically():
    a_lambdas, b_lambdas = LagrangeMultipliers(2), LagrangeMultipliers(2)
    a = PIMultiplierControl(a_lambdas, KLConstraint(0.05), kp=5.0)
    for kl in (0.1, 0.02, 0.3):
        a.step({0: kl, 1: kl / 2})
    b = PIMultiplierControl(b_lambdas, KLConstraint(0.05), kp=5.0)
    b.load_state_dict(a.state_dict())
    b_lambdas.load_state_dict(a_lambdas.state_dict())
    for kl in (0.07, 0.01):
        a.step({0: kl, 1: kl})
        b.step({0: kl, 1: kl})
    assert torch.equal(a_lambdas.values, b_lambdas.values)


@pytest.mark.parametrize("options, name", [
    ({"eps": 0.0}, "eps"), ({"eps": 0.1, "smoothing": 1.0}, "smoothing"), ({"eps": 0.1, "kp": -1.0}, "kp"),
    ({"eps": 0.1, "lr": [0.1]}, "lr_lambda"),
])
def test_errors_name_the_setting(options, name):
    options = dict(options)
    with pytest.raises(ValueError, match=name):
        PIMultiplierControl(LagrangeMultipliers(2), KLConstraint(options.pop("eps")), **options)
