"""Integrated Gradients and Occlusion at a site (captum_diffmask.methods.gradients)."""

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from captum_diffmask.methods.gradients import IntegratedGradients, Occlusion
from captum_diffmask.model.sites import SiteLocator
from captum_diffmask.evaluation.toy_task import toy_sites

from tiny_models import tiny_bert, tiny_causal_lm, tiny_seq2seq, token_batch, VOCAB


def wide_bert(seed: int = 0):
    """A tiny BERT with large random weights, so that its output moves by O(1)
    between the state and a zero baseline (the default init barely moves)."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, num_labels=3, max_position_embeddings=64, initializer_range=0.3,
    )
    return BertForSequenceClassification(config).eval()


def site_output(model, site, ids, mask, replacement=None):
    """Logits with ``site`` replaced (or not), and the state there: computed with
    the locator directly, not through the methods."""
    locator = SiteLocator.locate(model)
    with torch.no_grad():
        if replacement is None:
            with locator.capture([site]) as states:
                logits = model(input_ids=ids, attention_mask=mask).logits
            return logits, states[site]
        with locator.replace({site: replacement}):
            return model(input_ids=ids, attention_mask=mask).logits, None


@pytest.mark.parametrize("layer,site", [(0, "input"), (2, "hidden.2")])
def test_ig_completeness_against_independent_outputs(layer, site):
    model = wide_bert()
    ids, mask = token_batch()
    logits, state = site_output(model, site, ids, mask)
    target = logits.argmax(-1)
    # Padding keeps its state; real tokens go to zero.
    baseline = torch.where(mask.bool().unsqueeze(-1), torch.zeros_like(state), state)
    base_logits, _ = site_output(model, site, ids, mask, baseline)
    rows = torch.arange(len(ids))
    difference = logits[rows, target] - base_logits[rows, target]
    assert difference.abs().min() > 0.05  # a non-trivial check

    for method in ("riemann_trapezoid", "gausslegendre"):
        ig = IntegratedGradients(model, n_steps=50, method=method, reduction="sum", baselines=0.0)
        scores, delta = ig.attribute(ids, additional_forward_args=(mask,), layer=layer,
                                     return_convergence_delta=True)
        signed_sum = scores.sum(1)
        assert torch.allclose(signed_sum, difference, atol=1.5e-3), (method, signed_sum, difference)
        if method == "riemann_trapezoid":
            # Captum's raw trapezoid weights sum to 49/50: unrescaled, the sum
            # would miss by difference / 50, more than the tolerance.
            assert (signed_sum * 49 / 50 - difference).abs().max() > 3e-3
        assert delta.shape == (len(ids),)
        assert torch.allclose(delta, signed_sum - difference, atol=1e-5)
    assert ig.has_convergence_delta()


def test_ig_convergence_delta_small_with_many_steps():
    model = wide_bert()
    ids, mask = token_batch()
    ig = IntegratedGradients(model, n_steps=200)
    _, delta = ig.attribute(ids, additional_forward_args=(mask,), layer=0, return_convergence_delta=True)
    assert delta.abs().max() < 1e-3


def test_ig_reductions_and_shapes():
    model = tiny_bert()
    ids, mask = token_batch()
    kwargs = dict(additional_forward_args=(mask,), layer=0)
    signed = IntegratedGradients(model, n_steps=16, reduction="sum").attribute(ids, **kwargs)
    absolute = IntegratedGradients(model, n_steps=16).attribute(ids, **kwargs)
    norm = IntegratedGradients(model, n_steps=16, reduction="l2").attribute(ids, **kwargs)
    for scores in (signed, absolute, norm):
        assert scores.shape == ids.shape
        assert torch.isfinite(scores).all()
        assert (scores[mask == 0] == 0).all()
    assert torch.allclose(absolute, signed.abs())
    assert (norm * 32 ** 0.5 >= absolute - 1e-6).all()  # |sum_H a| <= sqrt(H) ||a||
    assert not torch.allclose(norm, absolute)
    for layer in (1, 2):
        scores = IntegratedGradients(model, n_steps=8).attribute((ids,), additional_forward_args=(mask,), layer=layer)
        assert isinstance(scores, tuple) and scores[0].shape == ids.shape
        assert (scores[0][mask == 0] == 0).all()
    # At the last layer only [CLS] reaches the classifier: every other token scores 0.
    last = IntegratedGradients(model, n_steps=8).attribute(ids, additional_forward_args=(mask,), layer=2)
    assert (last[:, 0] > 0).all() and (last[:, 1:] == 0).all()


def test_ig_target_and_errors():
    model = wide_bert()
    ids, mask = token_batch()
    ig = IntegratedGradients(model, n_steps=8, reduction="sum")
    predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    default = ig.attribute(ids, additional_forward_args=(mask,))
    assert torch.equal(default, ig.attribute(ids, target=predicted, additional_forward_args=(mask,)))
    other = ig.attribute(ids, target=(predicted + 1) % 3, additional_forward_args=(mask,))
    assert not torch.allclose(default, other)
    chunked = ig.attribute(ids, additional_forward_args=(mask,), internal_batch_size=5)
    assert torch.allclose(chunked, default, atol=1e-6)
    with pytest.raises(ValueError, match="target"):
        ig.attribute(ids, target=5, additional_forward_args=(mask,))
    with pytest.raises(ValueError, match="reduction"):
        IntegratedGradients(model, reduction="max")
    with pytest.raises(ValueError, match="n_steps"):
        IntegratedGradients(model, n_steps=0)
    with pytest.raises(ValueError, match="baseline"):
        IntegratedGradients(model, baselines=torch.zeros(5)).attribute(ids, additional_forward_args=(mask,))
    with pytest.raises(ValueError, match="layer"):
        ig.attribute(ids, additional_forward_args=(mask,), layer=3)


def test_ig_vector_baseline_equals_full_baseline():
    model = wide_bert()
    ids, mask = token_batch()
    vector = torch.randn(32, generator=torch.Generator().manual_seed(0))
    a = IntegratedGradients(model, baselines=vector, n_steps=8).attribute(ids, additional_forward_args=(mask,))
    b = IntegratedGradients(model, baselines=vector.expand(*ids.shape, 32).clone(), n_steps=8).attribute(
        ids, additional_forward_args=(mask,))
    assert torch.allclose(a, b)
    zero = IntegratedGradients(model, n_steps=8, baselines=0.0).attribute(ids, additional_forward_args=(mask,))
    assert not torch.allclose(a, zero)


FAMILIES = {"bert": lambda: (tiny_bert(), None), "gpt2": lambda: (tiny_causal_lm("gpt2"), None),
            "llama": lambda: (tiny_causal_lm("llama"), None), "t5": lambda: (tiny_seq2seq("t5"), "seq2seq"),
            "bart": lambda: (tiny_seq2seq("bart"), "seq2seq")}


def _family_batch(model, kind):
    if kind is None:
        ids, mask = token_batch()
        return ids, (mask,)
    ids, mask = token_batch()
    ids[mask == 0] = model.config.pad_token_id
    prefix = torch.tensor([[model.config.decoder_start_token_id, 7, 11]] * len(ids))
    return ids, (mask, prefix, torch.ones_like(prefix))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_at_the_defaults_the_signed_attributions_sum_to_the_output_difference_at_every_depth(family):
    import warnings

    model, kind = FAMILIES[family]()
    ids, extra = _family_batch(model, kind)
    ig = IntegratedGradients(model, reduction="sum")
    depths = ig.num_layers + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no gap warning at the defaults
        for layer in range(depths):
            scores, delta = ig.attribute(ids, additional_forward_args=extra, layer=layer,
                                         return_convergence_delta=True)
            difference = scores.sum(1) - delta  # F(h) - F(b), the mean state as b
            assert difference.abs().max() > 1e-5  # a non-trivial check (BART's outputs barely move)
            shown = scores.abs().sum(1)
            bound = IntegratedGradients.GAP_TOLERANCE * torch.maximum(difference.abs(), shown)
            assert (delta.abs() <= bound + 1e-6).all(), (layer, delta, difference, shown)
            assert ig.last_check[layer].startswith("checked: completeness gap")
    assert sorted(ig.last_check) == list(range(depths))


def test_the_authors_settings_on_a_normalised_hidden_site_warn_with_the_gap_and_the_fix():
    model = tiny_bert()  # config-built: bias-free maps into LayerNorm at hidden.1
    ids, mask = token_batch()
    authors = IntegratedGradients(model, method="riemann_trapezoid", baselines=0.0, reduction="sum")
    with pytest.warns(UserWarning, match=r"IntegratedGradients at hidden.1: the signed attributions miss F\(h\) - "
                                         r"F\(b\) .* raise n_steps \(internal_batch_size bounds the memory\), use "
                                         r"method='gausslegendre', or a baseline nearer the states"):
        scores, delta = authors.attribute(ids, additional_forward_args=(mask,), layer=1, return_convergence_delta=True)
    assert delta.abs().max() > 1e4 and authors.last_check[1].startswith("failed check: completeness gap")
    from captum_diffmask.interface.verdicts import layer_verdict

    assert layer_verdict(authors, 1) == authors.last_check[1] and layer_verdict(authors, 0) == ""


def test_ig_on_the_toy_model_at_the_ffnn_output(toy_setup):
    model, _, _, valid = toy_setup
    ids, query, mask = valid.ids[:64], valid.query[:64], valid.mask[:64]
    ig = IntegratedGradients(model, sites=toy_sites(model), padding_mask_arg=1, n_steps=50)
    scores, delta = ig.attribute(ids, additional_forward_args=(query, mask), layer=1,
                                 return_convergence_delta=True)
    assert scores.shape == ids.shape
    assert torch.isfinite(scores).all() and torch.isfinite(delta).all()
    assert (scores[~mask] == 0).all()
    # the toy's states at this site depend on the digit alone: a row of one digit repeated is its own mean
    # state (nothing in it differs from the baseline); every other row has scores (one digit alone: from zeros)
    uniform = torch.tensor([len(set(row[m].tolist())) == 1 and int(m.sum()) > 1 for row, m in zip(ids, mask)])
    assert (scores.sum(1) > 0).tolist() == (~uniform).tolist() and (~uniform).sum() > 60
    with pytest.raises(ValueError, match="target"):  # one binary logit: no target
        ig.attribute(ids, target=0, additional_forward_args=(query, mask), layer=1)


def test_occlusion_equals_a_manual_leave_one_out_loop():
    model = wide_bert()
    ids, mask = token_batch(batch=2, length=7, seed=3)
    for layer, site in ((0, "input"), (1, "hidden.1")):
        logits, state = site_output(model, site, ids, mask)
        target = logits.argmax(-1)
        rows = torch.arange(len(ids))
        expected = torch.zeros(ids.shape)
        for t in range(ids.shape[1]):
            occluded = state.clone()
            occluded[:, t] = 0.0
            out, _ = site_output(model, site, ids, mask, occluded)
            expected[:, t] = logits[rows, target] - out[rows, target]
        expected = expected * mask
        for per_eval in (1, 3):
            scores = Occlusion(model, perturbations_per_eval=per_eval).attribute(
                ids, additional_forward_args=(mask,), layer=layer)
            assert scores.shape == ids.shape
            assert torch.allclose(scores, expected, atol=1e-5), (layer, scores, expected)
        assert expected.abs().max() > 1e-3  # the check is not vacuous


def test_occlusion_takes_captums_window_and_stride_in_tokens():
    model = wide_bert()
    ids, mask = token_batch(batch=2, length=6, seed=3)
    mask[:] = 1
    logits, state = site_output(model, "input", ids, mask)
    target, rows = logits.argmax(-1), torch.arange(len(ids))
    drops = {}  # window of 2 at stride 2: tokens (0, 1), (2, 3), (4, 5) replaced together
    for start in (0, 2, 4):
        occluded = state.clone()
        occluded[:, start:start + 2] = 0.0
        out, _ = site_output(model, "input", ids, mask, occluded)
        drops[start] = logits[rows, target] - out[rows, target]
    expected = torch.stack([drops[t - t % 2] for t in range(6)], dim=1)
    occlusion = Occlusion(model)
    for window, stride in ((2, 2), ((2,), (2,)), ((2, 32), (2, 32))):
        scores = occlusion.attribute(ids, additional_forward_args=(mask,), sliding_window_shapes=window, strides=stride)
        assert torch.allclose(scores, expected, atol=1e-5), (window, scores, expected)
    assert not torch.allclose(occlusion.attribute(ids, additional_forward_args=(mask,)), expected, atol=1e-3)
    for bad in (0, (2, 5), (1, 2, 3)):
        with pytest.raises(ValueError, match=r"sliding_window_shapes must be a number of tokens w >= 1, \(w,\) "
                                             r"or \(w, 32\)"):
            occlusion.attribute(ids, additional_forward_args=(mask,), sliding_window_shapes=bad)


def test_occlusion_on_the_toy_model(toy_setup):
    model, _, _, valid = toy_setup
    ids, query, mask = valid.ids[:32], valid.query[:32], valid.mask[:32]
    occlusion = Occlusion(model, sites=toy_sites(model), padding_mask_arg=1)
    scores = occlusion.attribute(ids, additional_forward_args=(query, mask), layer=1)
    assert scores.shape == ids.shape and torch.isfinite(scores).all()
    assert (scores[~mask] == 0).all()
    # Manual check of one position of one example.
    locator = SiteLocator.locate(model, toy_sites(model))
    with torch.no_grad(), locator.capture(["hidden.1"]) as states:
        full = model(ids[:1], query[:1], mask[:1])
    occluded = states["hidden.1"].clone()
    occluded[0, 0] = 0.0
    with torch.no_grad(), locator.replace({"hidden.1": occluded}):
        out = model(ids[:1], query[:1], mask[:1])
    assert torch.allclose(scores[0, 0], (full - out)[0], atol=1e-5)
