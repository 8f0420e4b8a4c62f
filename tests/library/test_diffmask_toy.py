"""DiffMask on the paper's toy task, where the ground truth is known."""

import warnings

import pytest
import torch

from captum_diffmask import DiffMask, DiffMaskConvergenceWarning
from captum_diffmask import certify
from captum_diffmask.evaluation.ground_truth import js_to_ground_truth
from captum_diffmask.evaluation.toy_task import toy_ground_truth, toy_sites


def test_toy_model_solves_the_task(toy_setup):
    _, accuracy, _, _ = toy_setup
    assert accuracy >= 0.99


def test_hidden_mode_matches_the_ground_truth_at_the_ffnn_output(toy_setup):
    model, _, train, valid = toy_setup
    dm = DiffMask(model, mode="hidden", sites=toy_sites(model), padding_mask_arg=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiffMaskConvergenceWarning)  # it converges: no warning
        history = dm.fit(train.loader(128, shuffle=True, seed=0), eps=0.05, layers=[1], seed=0, verbose=False)
    assert dm.convergence[1]["status"] == "converged" and history[-1]["converged"]
    assert history[-1]["epoch"] < 100  # stopped by convergence, not by the cap
    # the constraint holds at the end: the last window's mean KL (the last epoch
    # may be a few steps only, the fit stops as soon as it has converged)
    assert dm.convergence[1]["windows"][-1]["kl"] <= 0.05 * 1.25
    attributions = dm.attribute(valid.ids, additional_forward_args=(valid.query, valid.mask), layer=1)
    truth = toy_ground_truth(valid.ids, valid.query, valid.mask)
    js = js_to_ground_truth(attributions, truth, valid.mask)
    js = js[~torch.isnan(js)].mean().item()
    assert js <= 0.05, js  # the paper reports 0.00
    # and a uniform attribution (keep everything) does not
    uniform = js_to_ground_truth(valid.mask.float(), truth, valid.mask)
    assert uniform[~torch.isnan(uniform)].mean().item() > 0.15


def test_input_mode_layer0_is_needed_and_uniform_and_layer1_concentrates_on_the_query(toy_setup):
    """The paper's toy-task figure, from one fit with fit's defaults and the votes
    shared across depths, as the paper made it: conditioned on the embeddings
    nothing can be dropped (layer 0 keeps everything, and the fit says that is
    its verdict: "needed"); conditioned on the FFNN states only the query digits
    are kept (layer 1 converged). Vote 0 serves both depths here, and depth 0's
    constraint holds it open; depth 0 fitted alone drops ~11 % of the tokens
    within eps 0.1, and the certificate, which judges "needed" without the
    probe's ranking, says so: the probe does not count as an all-needed answer."""
    model, _, train, valid = toy_setup
    dm = DiffMask(model, mode="input", sites=toy_sites(model), padding_mask_arg=1, probe_reads_input=False,
                  votes="tied")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiffMaskConvergenceWarning)  # both layers end with a verdict
        dm.fit(train.loader(128, shuffle=True, seed=0), eps=0.1, layers=[0, 1], seed=0, verbose=False)
    assert dm.convergence[0]["status"] == "needed" and dm.convergence[1]["status"] == "converged"
    # layer 0's measurement: closing the positions its probe ranks least needed breaks the constraint
    assert dm.convergence[0]["windows"][-1]["closure"] > 0.1 * 1.25
    # each example's cheapest position closed alone keeps the constraint at depth 0
    certificate = certify(dm, train.loader(128, shuffle=True, seed=1), list(valid.loader(128, shuffle=False, seed=0)))
    assert certificate.layers[0].single_closure_kl < 0.1 and not certificate.layers[0].counted
    assert "cheapest single position keeps the constraint" in certificate.layers[0].reasons[-1]
    every = dm.attribute(valid.ids, additional_forward_args=(valid.query, valid.mask), layer=None)
    truth = toy_ground_truth(valid.ids, valid.query, valid.mask)
    real, query = valid.mask, truth.bool()

    def mean_js(scores, target):
        js = js_to_ground_truth(scores, target, real)
        return js[~torch.isnan(js)].mean().item()

    layer0, layer1 = every[..., 0], every[..., 1]
    assert mean_js(layer0, real.float()) < 0.02  # uniform over the sequence
    assert mean_js(layer1, truth) < 0.05  # uniform over the query digits
    assert layer1[query].mean() - layer1[real & ~query].mean() > 0.8
    assert abs(layer0[query].mean() - layer0[real & ~query].mean()) < 0.05


def test_a_fit_capped_before_convergence_warns_naming_the_layer(toy_setup):
    model, _, train, _ = toy_setup
    dm = DiffMask(model, mode="hidden", sites=toy_sites(model), padding_mask_arg=1)
    with pytest.warns(DiffMaskConvergenceWarning, match=r"stopped at the cap max_steps=150 (.|\n)*layer 1: .*raise the cap.*kept share .*eps 0.05"):
        history = dm.fit(train.loader(128, shuffle=True, seed=0), eps=0.05, layers=[1], seed=0,
                         verbose=False, max_steps=150)
    assert sum(h["steps"] for h in history) == 150
    assert dm.convergence[1]["status"] != "converged" and not history[-1]["converged"]
