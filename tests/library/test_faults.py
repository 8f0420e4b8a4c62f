"""Faults stop a fit or a call with an error that names the argument, the step or
the layer, never with a perfect-looking result."""

import logging
import re

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.methods import IntegratedGradients

from tiny_models import HF_KINDS, LM_KINDS, tiny_bert, tiny_causal_lm, tiny_model, token_batch, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


def test_non_finite_weights_stop_the_fit_naming_step_and_layer():
    model = tiny_bert()
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))
    ids, mask = token_batch()
    dm = DiffMask(model, mode="hidden")
    with pytest.raises(FloatingPointError, match=r"non-finite at step 1 \(layer \d\)"):
        dm.fit([(ids, mask)] * 3, epochs=2, seed=0, verbose=False)


def test_non_finite_states_are_refused_by_attribute():
    model = tiny_bert()
    ids, mask = token_batch()
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="not finite"):
        dm.attribute(ids, additional_forward_args=(mask,), layer=1)


def test_nan_weights_are_named_as_such_not_as_a_site_mismatch():
    model = tiny_bert()
    with torch.no_grad():
        model.bert.encoder.layer[0].output.dense.weight[0, 0] = float("nan")
    ids, mask = token_batch()
    with pytest.raises(FloatingPointError, match=r"hidden_states\[1\] are not finite.*bert.encoder.layer.0.output.dense.weight"):
        IntegratedGradients(model).attribute(ids, additional_forward_args=(mask,), layer=1, n_steps=4)


def test_one_shot_iterators_empty_loaders_and_bad_rates_are_refused():
    ids, mask = token_batch()
    dm = DiffMask(tiny_bert(), mode="hidden")
    with pytest.raises(ValueError, match="one-shot iterator .* epochs=3"):
        dm.fit(iter([(ids, mask)] * 2), epochs=3, verbose=False)
    dm.fit(iter([(ids, mask)] * 2), epochs=1, verbose=False)  # one epoch: fine
    with pytest.raises(ValueError, match="dataloader: no batches"):
        DiffMask(tiny_bert()).fit([], verbose=False)
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        dm.fit([(ids, mask)], lr=-1, verbose=False)
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        dm.fit([(ids, mask)], lr=0.0, verbose=False)


def test_empty_batches_and_ids_outside_the_vocabulary_are_named():
    model = tiny_bert()
    ids, mask = token_batch()
    ig = IntegratedGradients(model)
    with pytest.raises(ValueError, match="at least one example of at least one token"):
        ig.attribute(ids[:0], additional_forward_args=(mask[:0],))
    with pytest.raises(ValueError, match="at least one example of at least one token"):
        ig.attribute(ids[:, :0], additional_forward_args=(mask[:, :0],))
    too_big = ids.clone()
    too_big[0, 0] = VOCAB
    with pytest.raises(ValueError, match=f"inputs holds token ids .*embedding has {VOCAB} entries"):
        ig.attribute(too_big, additional_forward_args=(mask,))
    with pytest.raises(ValueError, match=f"dataloader batch holds token ids .*{VOCAB} entries"):
        DiffMask(model).fit([(too_big, mask)], verbose=False)


@pytest.mark.parametrize("kind", HF_KINDS + LM_KINDS)
def test_a_call_longer_than_the_models_positions_is_named_with_the_fix(kind):
    from captum_diffmask.model.inputs import position_limit

    model = tiny_causal_lm(kind) if kind in LM_KINDS and kind != "gpt2" else tiny_model(kind)
    limit = position_limit(model)
    if kind == "llama":  # rotary positions: no table, no limit to enforce
        assert limit is None
        return
    ids = torch.randint(3, VOCAB, (1, limit + 1))
    with pytest.raises((RuntimeError, IndexError)):  # the model's own error: a size or an index
        model(input_ids=ids)
    assert model(input_ids=ids[:, :limit]).logits.shape[0] == 1  # the limit itself passes
    with pytest.raises(ValueError, match=f"inputs holds {limit + 1} tokens, but the model has {limit} positions: "
                                         f"truncate .*max_length={limit}"):
        IntegratedGradients(model).attribute(ids, target=0)
    with pytest.raises(ValueError, match=f"dataloader batch holds {limit + 1} tokens"):
        DiffMask(model).fit([(ids, torch.ones_like(ids))], verbose=False)


def test_attribute_runs_a_model_left_in_train_mode_in_eval_mode_and_restores_it():
    model = tiny_bert().train()  # dropout on: two calls would differ
    ids, mask = token_batch()
    ig = IntegratedGradients(model)
    first = ig.attribute(ids, additional_forward_args=(mask,), layer=0, n_steps=4)
    second = ig.attribute(ids, additional_forward_args=(mask,), layer=0, n_steps=4)
    assert torch.equal(first, second) and model.training
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    assert torch.equal(dm.attribute(ids, additional_forward_args=(mask,), layer=None),
                       dm.attribute(ids, additional_forward_args=(mask,), layer=None))
    assert model.training


def test_fit_logs_each_epochs_figures_when_verbose_and_nothing_when_not(caplog):
    ids, mask = token_batch()
    dm = DiffMask(tiny_bert(), mode="hidden")
    with caplog.at_level(logging.INFO, logger="captum_diffmask"):
        dm.fit([(ids, mask)] * 3, epochs=2, seed=0, convergence={"until_converged": False}, verbose=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "captum_diffmask"]
    assert any(line.startswith("DiffMask fit epoch 2/2, layer") for line in lines)
    assert all("KL" in line and "kept share" in line and "lambda" in line and "agreement" in line for line in lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="captum_diffmask"):
        dm.fit([(ids, mask)] * 3, epochs=2, seed=0, convergence={"until_converged": False}, verbose=False)
    assert not [r for r in caplog.records if r.name == "captum_diffmask"]


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_an_interrupted_fit_leaves_the_model_its_hooks_and_the_callers_rng_as_found(mode):
    # Ctrl-C in the middle of a masked forward pass of the third step
    model = tiny_bert().train()
    model.classifier.weight.requires_grad_(False)  # the caller's own flags come back too
    flags = [p.requires_grad for p in model.parameters()]
    ids, mask = token_batch()
    calls = []

    def interrupt(module, args, output):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt

    handle = model.bert.encoder.layer[1].register_forward_hook(interrupt)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with pytest.raises(KeyboardInterrupt):
        DiffMask(model, mode=mode).fit([(ids, mask)] * 4, max_steps=10, seed=0, verbose=False)
    handle.remove()
    assert len(calls) == 7
    assert model.training and all(m.training for m in model.modules())
    assert [p.requires_grad for p in model.parameters()] == flags
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
    assert torch.equal(torch.rand(3), expected)  # the fit's seed did not leak into the caller's stream


def test_fit_restores_each_modules_own_mode():
    model = tiny_bert().train()
    model.classifier.eval()  # a submodule in a mode other than its parent's
    ids, mask = token_batch()
    DiffMask(model, mode="hidden").fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False},
                                       verbose=False)
    assert model.training and model.bert.training and not model.classifier.training


@pytest.mark.parametrize("build", ["vit", "whisper"])
def test_a_model_that_does_not_take_token_ids_is_refused_when_built(build):
    import transformers as hf

    from captum_diffmask.methods import Occlusion

    if build == "vit":
        model = hf.ViTForImageClassification(hf.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=16, image_size=8, patch_size=4))
        wanted = "takes images (its main input is pixel_values), not token ids"
    else:
        model = hf.WhisperForConditionalGeneration(hf.WhisperConfig(
            vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_mel_bins=8,
            max_source_positions=8, max_target_positions=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[]))
        wanted = "takes audio features (its main input is input_features)"
    for method in (DiffMask, IntegratedGradients, Occlusion):
        with pytest.raises(ValueError, match=re.escape(f"model: {type(model).__name__} {wanted}") + ".*encoder-decoders"):
            method(model)
