"""Half-precision models: the objective stays in float32 and every method runs
on a bfloat16 model on the CPU."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.methods import ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, REINFORCE
from captum_diffmask.model.divergences import kl_divergence, log_probs

from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


def test_the_objective_of_bfloat16_logits_is_float32():
    logits = torch.tensor([[20.0, -20.0, 0.5]], dtype=torch.bfloat16)
    log_p = log_probs(logits)
    assert log_p.dtype == torch.float32 and torch.isfinite(log_p).all()
    assert kl_divergence(log_p, log_probs(logits.flip(-1))).dtype == torch.float32


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_diffmask_fits_a_bfloat16_model(mode):
    model = tiny_bert().to(torch.bfloat16)
    ids, mask = token_batch()
    dm = DiffMask(model, mode=mode)
    history = dm.fit([(ids, mask)] * 3, max_steps=6, seed=0, convergence={"until_converged": False}, verbose=False)
    assert all(isinstance(row["kl"], float) and row["kl"] == row["kl"] for row in history)  # no NaN
    scores = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all() and (scores[mask == 0] == 0).all()
    assert next(dm.probe.parameters()).dtype == torch.float32  # the probe and multipliers stay float32
    assert dm.lambdas.values.dtype == torch.float32


@pytest.mark.parametrize("method, options", [
    (IntegratedGradients, {"n_steps": 4}), (Occlusion, {}), (Guan, {"steps": 3, "verbose": False}),
    (PerExampleDiffMask, {"steps": 3, "verbose": False}), (REINFORCE, {"steps": 3, "verbose": False}),
], ids=lambda v: getattr(v, "__name__", ""))
def test_every_method_runs_on_a_bfloat16_model(method, options):
    model = tiny_bert().to(torch.bfloat16)
    ids, mask = token_batch()
    scores = method(model).attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all() and (scores[mask == 0] == 0).all()
    erasure = ExactErasure(model, verbose=False).attribute(ids, additional_forward_args=(mask,), layer=2)
    assert set(erasure.unique().tolist()) <= {0.0, 1.0}
