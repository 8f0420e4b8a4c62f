"""A model dispatched with accelerate's hooks (weights offloaded, moved to the
execution device when a module runs): capture, replacement and the partial re-run
work, and accelerate's hooks survive."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.model.forward import model_device

from tiny_models import tiny_bert, token_batch

accelerate = pytest.importorskip("accelerate")
pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


def _offloaded():
    model = tiny_bert()
    ids, mask = token_batch()
    reference = model(input_ids=ids, attention_mask=mask).logits
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))  # weights on "meta" between calls
    return model, ids, mask, reference


def _accelerate_state(model):
    return [(name, type(getattr(m, "_hf_hook", None)).__name__, vars(m).get("forward"))
            for name, m in model.named_modules()]


def test_partial_and_full_reruns_agree_and_accelerates_hooks_survive():
    model, ids, mask, reference = _offloaded()
    assert model_device(model) == torch.device("cpu")  # its execution device, not "meta"
    before = _accelerate_state(model)
    assert sum(hook != "NoneType" for _, hook, _ in before) > 10
    dm = DiffMask(model, mode="hidden")
    call = dm._prepare(ids, (mask,), None)
    states, original = dm.capture(call, dm.locator.names)
    assert torch.allclose(original, reference, atol=1e-6)
    for k in range(dm.num_layers + 1):
        site = f"hidden.{k}"
        partial = dm.replaced_logits(call, {site: 0.5 * states[site]})
        full = dm.replaced_logits(dm._prepare(ids, (mask,), None), {site: 0.5 * states[site]})
        assert torch.allclose(partial, full, atol=1e-5), site
    dm.fit([(ids, mask)] * 2, max_steps=3, seed=0, convergence={"until_converged": False}, verbose=False)
    assert dm.attribute(ids, additional_forward_args=(mask,), layer=1).shape == ids.shape
    assert _accelerate_state(model) == before  # the same hooks, the same wrapped forwards
    assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, reference, atol=1e-6)
