"""DiffMask on the paper's toy task, where the ground truth is known."""

import torch

from captum_diffmask import DiffMask
from captum_diffmask.metrics import js_to_ground_truth
from captum_diffmask.tasks.toy import toy_ground_truth, toy_sites


def test_toy_model_solves_the_task(toy_setup):
    _, accuracy, _, _ = toy_setup
    assert accuracy >= 0.99


def test_hidden_mode_matches_the_ground_truth_at_the_ffnn_output(toy_setup):
    model, _, train, valid = toy_setup
    dm = DiffMask(model, mode="hidden", sites=toy_sites(model), padding_mask_arg=1)
    history = dm.fit(
        train.loader(128, shuffle=True, seed=0), epochs=10, eps=0.05, lr=3e-3,
        layers=[1], seed=0, verbose=False,
    )
    assert history[-1]["kl"] < 0.1  # the constraint holds at the end
    attributions = dm.attribute(valid.ids, additional_forward_args=(valid.query, valid.mask), layer=1)
    truth = toy_ground_truth(valid.ids, valid.query, valid.mask)
    js = js_to_ground_truth(attributions, truth, valid.mask)
    js = js[~torch.isnan(js)].mean().item()
    assert js <= 0.05, js  # the paper reports 0.00
    # and a uniform attribution (keep everything) does not
    uniform = js_to_ground_truth(valid.mask.float(), truth, valid.mask)
    assert uniform[~torch.isnan(uniform)].mean().item() > 0.15
