"""Lookahead, and the paper's recipe that uses it (captum_diffmask.diffmask.constrained.lookahead)."""

import pytest
import torch

from captum_diffmask import DiffMask
from benchmarks.fit_presets import PAPER_FIT
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.diffmask.constrained.lookahead import Lookahead
from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers

from tiny_models import tiny_bert, token_batch


def test_every_k_steps_the_weights_go_back_halfway_to_the_slow_ones():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer = Lookahead(torch.optim.SGD([w], lr=0.1), k=3, alpha=0.5)
    for step in range(1, 7):
        w.grad = torch.tensor([1.0])  # each fast step: -0.1
        optimizer.step()
        if step == 2:
            assert float(w) == pytest.approx(0.8)
        if step == 3:  # fast 0.7, slow 1.0 -> 0.85
            assert float(w) == pytest.approx(0.85)
    assert float(w) == pytest.approx(0.85 + 0.5 * (-0.3))  # fast 0.55 from slow 0.85 -> 0.7
    state = optimizer.state_dict()
    again = Lookahead(torch.optim.SGD([torch.nn.Parameter(torch.tensor([0.7]))], lr=0.1), k=3)
    again.load_state_dict(state)
    assert again.steps == 6 and float(again.slow[0][0]) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="alpha"):
        Lookahead(torch.optim.SGD([w], lr=0.1), alpha=0.0)


def test_the_rmsprop_multiplier_rises_on_a_violation_by_about_its_rate():
    lambdas = LagrangeMultipliers(2)
    optimizer = lambdas.optimizer(0.1, rule="rmsprop")
    lambdas.values.grad = torch.tensor([0.5, -0.5])  # layer 0 violated, layer 1 slack
    optimizer.step()
    assert float(lambdas.values[0]) == pytest.approx(1.0 + 0.1 / 0.1, rel=0.01)  # RMSprop's first step: lr / sqrt(1 - 0.99)
    assert float(lambdas.values[1]) < 1.0
    with pytest.raises(ValueError, match="one rate"):
        lambdas.optimizer([0.1, 0.2], rule="rmsprop")


def test_the_papers_recipe_fits_and_still_reports_each_layers_verdict():
    dm = DiffMask(tiny_bert(), mode="input")
    batches = [token_batch(batch=4, length=9, seed=i) for i in range(4)]
    with pytest.warns(UserWarning):  # no stop at convergence: the warning names the layers
        history = dm.fit(batches, epochs=2, eps=0.5, seed=0, verbose=False, **grouped_options(PAPER_FIT))
    assert sum(h["steps"] for h in history) == 8  # one layer drawn per batch, 2 epochs of 4
    assert all(r["status"] for r in dm.convergence.values())
    assert isinstance(dm.attribute(batches[0][0], additional_forward_args=(batches[0][1],), layer=1), torch.Tensor)
