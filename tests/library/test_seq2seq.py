"""Encoder-decoder language models (T5, BART, Marian): every method attributes the
decoder's next token after a given prefix to the encoder's input tokens, with no
forward_func; padding of either side changes nothing, and the sites are the
encoder's own states."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.methods import IntegratedGradients
from captum_diffmask.model.forward import ModelForward

from tiny_models import every_method, prepared_method, SEQ2SEQ_KINDS, tiny_seq2seq, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
SOURCES = [[5, 17, 33, 8, 21, 40], [9, 12, 44, 3, 30, 26, 11, 7, 19], [14, 6, 28]]
PREFIXES = [[7, 9], [4], [22, 13, 31]]  # after the decoder's start token
METHODS = every_method({"n_steps": 8, "target": 7})


def right_padded(rows, pad_id):
    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    return ids, mask


def batch_of(model, rows=None):
    r"""(ids, mask, decoder prefix, its mask) of the rows (default: all), both sides
    right-padded with the model's pad token."""
    rows = range(len(SOURCES)) if rows is None else rows
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    ids, mask = right_padded([SOURCES[r] for r in rows], pad)
    prefix, prefix_mask = right_padded([[start] + PREFIXES[r] for r in rows], pad)
    return ids, mask, prefix, prefix_mask


@pytest.mark.parametrize("kind", SEQ2SEQ_KINDS)
def test_the_kept_output_is_the_next_decoder_token_after_each_prefix(kind):
    model = tiny_seq2seq(kind)
    forward = ModelForward(model)
    ids, mask, prefix, prefix_mask = batch_of(model)
    logits = forward(ids, (mask, prefix, prefix_mask))
    assert forward.output == "last" and logits.shape == (len(SOURCES), VOCAB)
    for row in range(len(SOURCES)):
        alone = model(input_ids=torch.tensor([SOURCES[row]]),
                      decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id] + PREFIXES[row]]))
        assert torch.allclose(logits[row], alone.logits[0, -1], atol=1e-5)
    # a tokenizer's dict batch is read the same way
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": prefix,
             "decoder_attention_mask": prefix_mask}
    assert torch.allclose(forward(*forward.split_batch(batch)), logits)


@pytest.mark.parametrize("kind", SEQ2SEQ_KINDS)
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_attributes_the_encoders_tokens_and_padding_changes_nothing(kind, name):
    model = tiny_seq2seq(kind)
    ids, mask, prefix, prefix_mask = batch_of(model)
    method, options = prepared_method(METHODS, name, model, (ids, mask, prefix, prefix_mask), (0, 1, 2))
    for layer in (0, 1, 2):
        torch.manual_seed(0)
        batch = method.attribute(ids, additional_forward_args=(mask, prefix, prefix_mask), layer=layer, **options)
        assert batch.shape == ids.shape and torch.isfinite(batch).all()
        assert (batch[mask == 0] == 0).all()
        if name == "Random":
            continue
        one = batch_of(model, [0])  # the first row alone: neither side padded
        torch.manual_seed(0)
        alone = method.attribute(one[0], additional_forward_args=one[1:], layer=layer, **options)[0]
        padded = batch[0, :len(SOURCES[0])]
        absolute, relative = (1e-6, 1e-5) if METHODS[name][2] else (1e-3, 2e-2)
        scale = alone.abs().max()  # T5's gradient scores run to 1e7, Occlusion's to 1e-4
        assert (padded - alone).abs().max() <= absolute + relative * scale, (padded, alone)


@pytest.mark.parametrize("kind", SEQ2SEQ_KINDS)
def test_the_sites_are_the_encoders_own_states(kind):
    model = tiny_seq2seq(kind)
    ids, mask, prefix, prefix_mask = batch_of(model)
    ig = IntegratedGradients(model)
    call = ig._prepare(ids, (mask, prefix, prefix_mask), 1)
    names = ["hidden.0", "hidden.1", "hidden.2"]
    states, logits = ig.capture(call, names)
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=mask, decoder_input_ids=prefix, decoder_attention_mask=prefix_mask,
                    output_hidden_states=True)
    real = mask.bool()
    # the last of transformers' states is after the final layer norm for T5 (as for
    # GPT-2), the last block's output for BART and Marian: the sites are the blocks'
    for k, name in enumerate(names[:-1] if kind == "t5" else names):
        assert torch.allclose(states[name][real], own.encoder_hidden_states[k][real], atol=1e-4), name
    with torch.no_grad():  # a site replaced by itself: the same next-token logits
        same = ig.replaced_logits(call, {"hidden.1": states["hidden.1"]})
    assert torch.allclose(same, logits, atol=1e-5)


@pytest.mark.parametrize("kind", SEQ2SEQ_KINDS)
def test_diffmask_fits_on_dict_batches_and_attributes_every_layer(kind):
    model = tiny_seq2seq(kind)
    ids, mask, prefix, prefix_mask = batch_of(model)
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": prefix,
             "decoder_attention_mask": prefix_mask, "labels": prefix}  # targets dropped
    dm = DiffMask(model, mode="input")
    dm.fit([batch] * 2, max_steps=3, seed=0, verbose=False)
    every = dm.attribute(ids, additional_forward_args=(mask, prefix, prefix_mask), layer=None)
    assert every.shape == (*ids.shape, 3) and ((every >= 0) & (every <= 1)).all()
    assert (every[mask == 0] == 0).all()


def test_without_the_decoders_prefix_the_error_says_what_to_pass():
    model = tiny_seq2seq("t5")
    ids, mask, _, _ = batch_of(model)
    with pytest.raises(ValueError, match=r"T5ForConditionalGeneration is an encoder-decoder: give the decoder's "
                                         r"prefix.*decoder_input_ids.*config.decoder_start_token_id \(0\)"):
        IntegratedGradients(model).attribute(ids, additional_forward_args=(mask,), target=3)
    with pytest.raises(ValueError, match="the element read as decoder_attention_mask has shape"):
        ModelForward(model).split_batch((ids, mask, ids[:, :2], mask))


@pytest.mark.parametrize("kind", SEQ2SEQ_KINDS)
def test_a_generation_is_attributed_step_by_step_to_the_encoders_tokens(kind):
    from captum_diffmask import attribute_generation
    from captum_diffmask.interface.generation import greedy_continuation

    model = tiny_seq2seq(kind)
    source, start = torch.tensor(SOURCES[1]), model.config.decoder_start_token_id
    generated = greedy_continuation(model, source, 4)
    prefix = [start]
    for token in generated.tolist():  # each token the argmax after the prefix before it
        with torch.no_grad():
            logits = model(input_ids=source[None], decoder_input_ids=torch.tensor([prefix])).logits[0, -1]
        assert token == int(logits.argmax())
        prefix.append(token)
    ig = IntegratedGradients(model)
    result = attribute_generation(model, ig, source, max_new_tokens=4, n_steps=8)
    assert result.scores.shape == (4, len(SOURCES[1])) and result.defined.all()
    assert result.source_tokens == [str(i) for i in SOURCES[1]] and len(result.step_tokens) == 4
    for step in range(4):  # step t: the next token after [start] + generated[:t]
        alone = ig.attribute(source[None], target=int(generated[step]), n_steps=8, additional_forward_args=(
            torch.ones(1, len(source), dtype=torch.long), torch.tensor([[start] + generated[:step].tolist()])))
        assert torch.allclose(result.scores[step], alone[0], rtol=1e-4, atol=1e-6)
    assert "the tokens of the encoder's input" in result.to_html()
