"""Properties over random batch sizes, lengths and padding patterns, for every
method: the contract's shape, 0 on padding, no NaN; and DiffMask's batch
invariance (an example alone or inside a batch gets the same scores)."""

import pytest
import torch
from hypothesis import given, HealthCheck, settings, strategies as st

from captum_diffmask import DiffMask
from captum_diffmask.methods import (
    ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, PerSampleBottleneck, REINFORCE,
)

from tiny_models import tiny_bert, token_batch, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
FEW = {"steps": 3, "verbose": False}
MODEL = tiny_bert()


def _fitted(mode):
    ids, mask = token_batch()
    dm = DiffMask(MODEL, mode=mode)
    dm.fit([(ids, mask)] * 3, max_steps=6, seed=0, convergence={"until_converged": False}, verbose=False)
    return dm


def _bottleneck():
    method = PerSampleBottleneck(MODEL)
    ids, mask = token_batch()
    for layer in (0, 2):
        method.fit_statistics([(ids, mask)], layer=layer)
    return method


METHODS = {
    "DiffMask-input": (lambda: _fitted("input"), {}),
    "DiffMask-hidden": (lambda: _fitted("hidden"), {}),
    "IntegratedGradients": (lambda: IntegratedGradients(MODEL), {"n_steps": 4}),
    "Occlusion": (lambda: Occlusion(MODEL), {}),
    "PerSampleBottleneck": (_bottleneck, FEW),
    "Guan": (lambda: Guan(MODEL), FEW),
    "PerExampleDiffMask": (lambda: PerExampleDiffMask(MODEL), FEW),
    "REINFORCE": (lambda: REINFORCE(MODEL), FEW),
    "ExactErasure": (lambda: ExactErasure(MODEL, verbose=False, budget=300), {}),
}
EXPLAINERS = {}


def _explainer(name):
    if name not in EXPLAINERS:
        EXPLAINERS[name] = METHODS[name][0]()
    return EXPLAINERS[name], METHODS[name][1]


@st.composite
def padded_batches(draw):
    batch = draw(st.integers(1, 4))
    length = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 10_000))
    ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(length).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("name", sorted(METHODS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=padded_batches(), layer=st.sampled_from([0, 2]))
def test_shape_padding_and_finiteness_on_any_padded_batch(name, data, layer):
    ids, mask = data
    explainer, options = _explainer(name)
    scores = explainer.attribute(ids, additional_forward_args=(mask,), layer=layer, **options)
    assert scores.shape == ids.shape
    assert torch.isfinite(scores).all()
    assert (scores[mask == 0] == 0).all()


@pytest.mark.parametrize("mode", ["input", "hidden"])
@settings(max_examples=15, deadline=None)
@given(data=padded_batches(), row=st.integers(0, 3))
def test_diffmask_scores_an_example_alone_as_inside_its_batch(mode, data, row):
    ids, mask = data
    row = row % ids.shape[0]
    explainer, _ = _explainer(f"DiffMask-{mode}")
    together = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    alone = explainer.attribute(ids[row:row + 1], additional_forward_args=(mask[row:row + 1],), layer=None)
    assert torch.allclose(together[row:row + 1], alone, atol=1e-5)
