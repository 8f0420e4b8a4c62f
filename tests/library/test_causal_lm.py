"""Decoder-only language models: every method attributes the next token at each
prompt's last real position, and left padding changes nothing."""

import pytest
import torch

from captum_diffmask.model.forward import ModelForward

from tiny_models import every_method, left_padded, LM_KINDS, prepared_method, tiny_causal_lm, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
PROMPTS = [[5, 17, 33, 8, 21, 40], [9, 12, 44, 3, 30, 26, 11, 7, 19], [14, 6, 28]]
METHODS = every_method({"n_steps": 8, "target": 7})


@pytest.mark.parametrize("kind", LM_KINDS)
def test_the_kept_output_is_the_next_token_at_the_last_real_position(kind):
    model = tiny_causal_lm(kind)
    ids, mask = left_padded(PROMPTS)
    forward = ModelForward(model)
    logits = forward(ids, (mask,))
    assert forward.output == "last" and logits.shape == (len(PROMPTS), VOCAB)
    for row, prompt in enumerate(PROMPTS):
        alone = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        assert torch.allclose(logits[row], alone, atol=1e-5)


@pytest.mark.parametrize("kind", LM_KINDS)
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_gives_the_contracts_shape_and_left_padding_changes_nothing(kind, name):
    model = tiny_causal_lm(kind)
    ids, mask = left_padded(PROMPTS)
    method, options = prepared_method(METHODS, name, model, (ids, mask), (0, 1))
    for layer in (0, 1):
        torch.manual_seed(0)
        batch = method.attribute(ids, additional_forward_args=(mask,), layer=layer, **options)
        assert batch.shape == ids.shape and torch.isfinite(batch).all()
        assert (batch[mask == 0] == 0).all()
        if name == "Random":
            continue
        # one prompt alone against the same prompt left-padded in the batch
        prompt = torch.tensor([PROMPTS[0]])
        torch.manual_seed(0)
        alone = method.attribute(prompt, additional_forward_args=(torch.ones_like(prompt),), layer=layer, **options)
        padded = batch[0, ids.shape[1] - len(PROMPTS[0]):]
        tolerance = {"atol": 1e-5, "rtol": 0} if METHODS[name][2] else {"atol": 1e-3, "rtol": 1e-2}
        assert torch.allclose(padded, alone[0], **tolerance), (padded, alone[0])


def test_gpt2s_absolute_positions_are_counted_over_real_tokens():
    model = tiny_causal_lm("gpt2")
    ids, mask = left_padded(PROMPTS)
    # without position ids from the mask, a left-padded GPT-2 row changes its output
    shifted = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    kept = ModelForward(model)(ids, (mask,))
    alone = model(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1]
    assert torch.allclose(kept[0], alone, atol=1e-5)
    assert not torch.allclose(shifted[0], alone, atol=1e-3)
