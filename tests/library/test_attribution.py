"""The base contract every method shares: layers, targets, baselines."""

import pytest
import torch

from captum_diffmask.model.arguments import check_layer, resolve_baseline, resolve_target, site_for_layer
from captum_diffmask.model.divergences import log_probs


def test_resolve_target_on_class_logits_and_on_log_probabilities():
    log_p = log_probs(torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]))
    assert resolve_target(log_p, None).tolist() == [1, 0]
    assert resolve_target(log_p, 2).tolist() == [2, 2]
    assert resolve_target(log_p, [0, 2]).tolist() == [0, 2]
    assert resolve_target(log_p, torch.tensor([1, 1])).tolist() == [1, 1]
    with pytest.raises(ValueError, match="target"):
        resolve_target(log_p, 3)
    with pytest.raises(ValueError, match="target"):
        resolve_target(log_p, [0, 1, 2])
    with pytest.raises(TypeError, match="target"):
        resolve_target(log_p, 0.5)
    binary = log_probs(torch.tensor([-1.0, 2.0]))  # a single logit as two classes: class 1 = "> 0"
    assert resolve_target(binary, None).tolist() == [0, 1]
    assert resolve_target(torch.tensor([-1.0, 2.0]), None) is None  # the logit itself is attributed
    with pytest.raises(ValueError, match="target must be None"):
        resolve_target(torch.tensor([-1.0, 2.0]), 1)


def test_check_layer_and_site_for_layer_name_the_argument():
    assert check_layer(2, 3) == 2 and check_layer(None, 3, allow_none=True) is None
    assert site_for_layer(0, 3) == "input" and site_for_layer(3, 3) == "hidden.3"
    with pytest.raises(TypeError, match="layer"):
        check_layer(None, 3)
    with pytest.raises(ValueError, match="layer must be in 0..3"):
        site_for_layer(4, 3)
    with pytest.raises(TypeError, match="layer"):
        site_for_layer(True, 3)


def test_resolve_baseline_shapes_defaults_and_padding():
    state = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    zeros = resolve_baseline(None, state, mask)
    assert torch.equal(zeros[mask], torch.zeros(5, 4)) and torch.equal(zeros[~mask], state[~mask])
    mean = resolve_baseline(None, state, mask, default="mean")
    assert torch.allclose(mean[0, 0], state[mask].mean(0))
    assert torch.equal(resolve_baseline(2.0, state, mask)[1, 2], torch.full((4,), 2.0))
    vector = torch.tensor([1.0, -1.0, 0.5, 0.0])
    assert torch.equal(resolve_baseline(vector, state, mask)[1, 0], vector)
    assert torch.equal(resolve_baseline(state + 1, state, mask)[mask], (state + 1)[mask])
    with pytest.raises(ValueError, match="baselines must be"):
        resolve_baseline(torch.zeros(5), state, mask)
    with pytest.raises(TypeError, match="baselines"):
        resolve_baseline([0.0] * 4, state, mask)


def test_a_custom_model_given_a_mask_but_no_padding_mask_arg_is_warned_about_once():
    import warnings

    from captum_diffmask.methods import Occlusion
    from captum_diffmask.evaluation.toy_task import ToyModel, toy_sites

    torch.manual_seed(0)
    model = ToyModel().eval()
    ids, query = torch.randint(0, 10, (2, 6)), torch.randint(0, 10, (2, 2))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 4:] = 0
    method = Occlusion(model, sites=toy_sites(model))
    with pytest.warns(UserWarning, match=r"additional_forward_args\[1\] looks like a padding mask.*padding_mask_arg=1"):
        method.attribute(ids, additional_forward_args=(query, mask))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        method.attribute(ids, additional_forward_args=(query, mask))  # once per method
        Occlusion(model, sites=toy_sites(model), padding_mask_arg=None).attribute(
            ids, additional_forward_args=(query, mask))  # said: no warning
        scores = Occlusion(model, sites=toy_sites(model), padding_mask_arg=1).attribute(
            ids, additional_forward_args=(query, mask))
    assert (scores[0, 4:] == 0).all()
