"""What every method promises: one shape, padding 0, clear errors, no hook left behind."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.methods import (
    ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, PerSampleBottleneck, RandomAttribution,
    ReadoutBottleneck, REINFORCE,
)

from tiny_models import tiny_bert, tiny_model, token_batch

FEW = {"steps": 5, "verbose": False}
METHODS = {
    "IntegratedGradients": (lambda m: IntegratedGradients(m), {"n_steps": 8}),
    "Occlusion": (lambda m: Occlusion(m), {}),
    "PerSampleBottleneck": (lambda m: PerSampleBottleneck(m), FEW),
    "ReadoutBottleneck": (lambda m: ReadoutBottleneck(m), {}),
    "Guan": (lambda m: Guan(m), FEW),
    "PerExampleDiffMask": (lambda m: PerExampleDiffMask(m), FEW),
    "REINFORCE": (lambda m: REINFORCE(m), FEW),
    "ExactErasure": (lambda m: ExactErasure(m, verbose=False), {}),
    "RandomAttribution": (lambda m: RandomAttribution(m), {}),
}


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _make(name, model, ids, mask):
    factory, options = METHODS[name]
    method = factory(model)
    if name == "PerSampleBottleneck":
        for layer in (0, 1, 2):
            method.fit_statistics([(ids, mask)], layer=layer)
    if name == "ReadoutBottleneck":
        method.fit([(ids, mask)] * 2, layers=[0, 1, 2], epochs=1, verbose=False)
    return method, options


@pytest.mark.parametrize("name", sorted(METHODS))
def test_same_shape_padding_zero_and_no_hooks_left(name):
    model = tiny_bert()
    ids, mask = token_batch()
    method, options = _make(name, model, ids, mask)
    assert method.multiplies_by_inputs == (name == "IntegratedGradients")  # (h - b) x the gradient integral
    for layer in (0, 2):
        scores = method.attribute(ids, additional_forward_args=(mask,), layer=layer, **options)
        assert scores.shape == ids.shape
        assert torch.isfinite(scores).all()
        assert (scores[mask == 0] == 0).all()
    assert _hooks(model) == 0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_bad_input_errors_name_the_argument(name):
    model = tiny_bert()
    ids, mask = token_batch()
    method, options = _make(name, model, ids, mask)
    with pytest.raises(ValueError, match="layer"):
        method.attribute(ids, additional_forward_args=(mask,), layer=3, **options)
    with pytest.raises(TypeError, match="inputs"):
        method.attribute(ids.float(), additional_forward_args=(mask,), layer=0, **options)
    with pytest.raises(ValueError, match="inputs"):
        method.attribute(ids[0], additional_forward_args=(mask[0],), layer=0, **options)
    with pytest.raises(TypeError, match=rf"^{name}.attribute\(\) does not take colour=; it takes inputs, target, "):
        method.attribute(ids, additional_forward_args=(mask,), layer=0, colour="red", **options)


@pytest.mark.parametrize("name", sorted(set(METHODS) - {"RandomAttribution"}) + ["DiffMask"])  # Random runs no pass
def test_hooks_are_removed_when_the_forward_raises(name):
    model = tiny_bert()
    ids, mask = token_batch()
    calls = {"n": 0}

    def flaky_forward(input_ids, attention_mask):
        calls["n"] += 1
        if calls["n"] > 1:  # the first (capture) pass works, later ones fail
            raise RuntimeError("boom")
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    if name == "DiffMask":
        method, options = DiffMask(model, forward_func=flaky_forward), {}
        with pytest.raises(RuntimeError, match="boom"):
            method.fit([(ids, mask)], epochs=1, verbose=False)
    else:
        factory, options = METHODS[name]
        method = type(factory(model))(model, forward_func=flaky_forward, padding_mask_arg=0)
        if name == "PerSampleBottleneck":
            method.fit_statistics([(ids, mask)], layer=2)
            calls["n"] = 0
        with pytest.raises(RuntimeError, match="boom"):
            if name == "ReadoutBottleneck":  # attributes in one pass: its fit's second pass fails
                method.fit([(ids, mask)], layers=[2], epochs=1, verbose=False)
            else:
                method.attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    assert _hooks(model) == 0
    assert all(p.requires_grad for p in model.parameters())  # frozen() restored them


def test_missing_statistics_and_budget_errors():
    model = tiny_bert()
    ids, mask = token_batch()
    with pytest.raises(ValueError, match="fit_statistics"):
        PerSampleBottleneck(model).attribute(ids, additional_forward_args=(mask,), layer=2, **FEW)
    with pytest.raises(ValueError, match="budget"):
        ExactErasure(model, budget=0)


@pytest.mark.parametrize("kind", ["bert", "distilbert", "gpt2"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_partial_rerun_gives_the_full_rerun_scores(name, kind):
    # The replaced passes re-run only the blocks after the site (Captum's
    # repeated batches included); the scores must be those of whole re-runs.
    model = tiny_model(kind)
    ids, mask = token_batch()
    scores = {}
    for rerun in ("partial", "full"):
        method, options = _make(name, model, ids, mask)
        method.rerun = rerun
        torch.manual_seed(0)  # the same noise for the stochastic methods
        scores[rerun] = [method.attribute(ids, additional_forward_args=(mask,), layer=layer, **options)
                         for layer in (1, 2)]
    for partial, full in zip(scores["partial"], scores["full"]):
        assert torch.allclose(partial, full, atol=1e-5, rtol=1e-4)
    assert _hooks(model) == 0


def test_partial_rerun_skips_the_blocks_before_the_site():
    model = tiny_bert()
    ids, mask = token_batch()
    calls = []
    method = IntegratedGradients(model)
    method.attribute(ids, additional_forward_args=(mask,), layer=2, n_steps=4)  # the first call checks the sites
    # a reused block still runs its own hooks, but not its submodules
    handle = model.bert.encoder.layer[0].attention.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        method.attribute(ids, additional_forward_args=(mask,), layer=2, n_steps=4)
        assert len(calls) == 1  # the capture pass only; the 4 steps start after block 0
        method = IntegratedGradients(model)
        method.rerun = "full"
        method.attribute(ids, additional_forward_args=(mask,), layer=2, n_steps=4)
        assert len(calls) > 2
    finally:
        handle.remove()


# ------------------------------------------------------------ the contract
def _fitted_diffmask(model, ids, mask):
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)], max_steps=2, seed=0, verbose=False, convergence={"until_converged": False})
    return dm


ALL = sorted(METHODS) + ["DiffMask"]


def _any(name, model, ids, mask):
    if name == "DiffMask":
        return _fitted_diffmask(model, ids, mask), {}
    return _make(name, model, ids, mask)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ALL)
def test_target_is_honoured_or_refused_by_name(name):
    model = tiny_bert()
    ids, mask = token_batch()
    method, options = _any(name, model, ids, mask)
    run = lambda target: method.attribute(ids, target=target, additional_forward_args=(mask,), layer=2, **options)  # noqa: E731
    if method.uses_target:
        by_class = [run(c) for c in range(3)]
        assert any(not torch.equal(by_class[0], other) for other in by_class[1:]), name
        assert torch.equal(run(None), run(model(input_ids=ids, attention_mask=mask).logits.argmax(-1)))
    else:
        with pytest.raises(ValueError, match="target must be None"):
            run(1)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ALL)
def test_baselines_per_call_change_the_result_where_a_method_uses_them(name):
    model = tiny_bert()
    ids, mask = token_batch()
    method, options = _any(name, model, ids, mask)
    # at the token embeddings, where what replaces a token changes what the model reads
    run = lambda **kw: method.attribute(ids, additional_forward_args=(mask,), layer=0, **options, **kw)  # noqa: E731
    if not method.uses_baselines:
        with pytest.raises(TypeError, match="baselines"):
            run(baselines=0.0)
        return
    if name in ("PerExampleDiffMask", "REINFORCE"):
        # long enough for the KL (which the baseline sets) to move the gates
        options = {**options, "steps": 40, "eps": 0.0}
    # not a constant: BERT's LayerNorm after the embeddings removes a constant shift
    far_vector = 5.0 * torch.randn(32, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    far = run(baselines=far_vector)
    torch.manual_seed(0)
    near = run(baselines=torch.zeros(32))
    assert not torch.equal(far, near)
    assert (far[mask == 0] == 0).all()
    if hasattr(method, "baseline"):  # the constructor's default is the fallback
        method.baseline = far_vector
        torch.manual_seed(0)
        assert torch.equal(run(), far)


def test_integrated_gradients_multiplies_by_inputs_as_captum_does():
    from captum.attr import IntegratedGradients as CaptumIG

    ours = IntegratedGradients(tiny_bert())
    assert ours.multiplies_by_inputs == CaptumIG(lambda x: x).multiplies_by_inputs is True
    assert ours.has_convergence_delta() and not Occlusion(tiny_bert()).has_convergence_delta()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ALL)
def test_attribute_leaves_the_global_rng_as_found_and_is_logged(name):
    model = tiny_bert()
    ids, mask = token_batch()
    method, options = _any(name, model, ids, mask)
    assert getattr(type(method).attribute, "attribution_call", False), name  # Captum's log_usage + the RNG fork
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = method.attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    assert torch.equal(torch.get_rng_state(), before)
    again = method.attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    if name == "RandomAttribution":  # draws from its own generator, which moves on: never from the caller's
        assert not torch.equal(first, again)
    else:
        assert torch.equal(first, again)  # the same draws: the caller's sequence was rewound


def test_diffmask_fit_with_a_seed_leaves_the_global_rng_as_found():
    model = tiny_bert()
    ids, mask = token_batch()
    torch.manual_seed(7)
    before = torch.get_rng_state()
    dm = _fitted_diffmask(model, ids, mask)
    assert torch.equal(torch.get_rng_state(), before)
    again = _fitted_diffmask(model, ids, mask)
    for a, b in zip(dm.probe.parameters(), again.probe.parameters()):
        assert torch.equal(a, b)  # the seed alone decides the fit


def _model_snapshot(model):
    return {
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "parameters": {n: p.detach().clone() for n, p in model.named_parameters()},
        "instance_attributes": [sorted(vars(m)) for m in model.modules()],
        "hooks": _hooks(model),
    }


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ALL)
def test_nothing_on_the_users_model_is_left_changed(name):
    model = tiny_bert().train()  # in training mode, some parameters frozen by the user
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    ids, mask = token_batch()
    before = _model_snapshot(model)
    method, options = _any(name, model, ids, mask)
    for layer in (0, 2):
        method.attribute(ids, additional_forward_args=(mask,), layer=layer, **options)
    after = _model_snapshot(model)
    assert after["training"] == before["training"] and after["requires_grad"] == before["requires_grad"]
    assert after["instance_attributes"] == before["instance_attributes"] and after["hooks"] == before["hooks"]
    assert all(torch.equal(before["parameters"][n], p) for n, p in after["parameters"].items())


@pytest.mark.parametrize("name", ["IntegratedGradients", "DiffMask"])
def test_a_forward_set_on_a_module_by_someone_else_survives_the_partial_rerun(name):
    model = tiny_bert()
    ids, mask = token_batch()
    embeddings = model.bert.embeddings  # hidden.0: its recorded output stands in for it
    class_forward = embeddings.forward
    calls = []

    def wrapped(*args, **kwargs):  # as accelerate's hooks wrap a device-mapped module's forward
        calls.append(1)
        return class_forward(*args, **kwargs)

    embeddings.forward = wrapped
    method, options = _any(name, model, ids, mask)
    method.attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    assert vars(embeddings)["forward"] is wrapped
    before = len(calls)
    model(input_ids=ids, attention_mask=mask)
    assert len(calls) == before + 1  # still in the path


@pytest.mark.parametrize("name", ["IntegratedGradients", "Occlusion", "PerExampleDiffMask", "DiffMask"])
def test_a_model_left_in_train_mode_is_attributed_in_eval_mode_and_left_in_its_modes(name):
    # dropout 0.5: in train mode two calls, and the eval-mode answer, would differ
    model = tiny_bert()
    model.config.hidden_dropout_prob = 0.5
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    ids, mask = token_batch()
    if name == "DiffMask":
        method = DiffMask(model, mode="hidden")
        method.fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
        options = {}
    else:
        method, options = _make(name, model, ids, mask)
    torch.manual_seed(0)
    expected = method.attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    model.train()
    model.classifier.eval()  # a submodule's own mode is restored as it was, too
    torch.manual_seed(0)
    got = method.attribute(ids, additional_forward_args=(mask,), layer=2, **options)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert model.training and model.bert.training and not model.classifier.training


def test_captums_baselines_keyword_is_refused_with_the_reason_where_a_method_has_none():
    ids, mask = token_batch()
    with pytest.raises(TypeError, match=r"^DiffMask.attribute\(\) does not take baselines=: it has no baseline "
                                        r"argument \(DiffMask replaces gated positions by the baseline its fit"):
        DiffMask(tiny_bert(), mode="input").attribute(ids, additional_forward_args=(mask,), baselines=0.0)
