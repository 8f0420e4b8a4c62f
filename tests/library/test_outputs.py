"""Declared outputs: class logits, a language model's next token or every
position, a question-answering head's start and end; anything else is refused."""

import pytest
import torch
import transformers as hf

from captum_diffmask import DiffMask
from captum_diffmask.model.forward import ModelForward
from captum_diffmask.methods import IntegratedGradients, Occlusion, PerExampleDiffMask

from tiny_models import token_batch, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)


def _gpt2_lm():
    torch.manual_seed(0)
    return hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64)).eval()


def _bert(cls):
    torch.manual_seed(0)
    return cls(hf.BertConfig(**SMALL)).eval()


def test_a_causal_lm_keeps_the_next_token_at_each_rows_last_real_position():
    model = _gpt2_lm()
    ids, mask = token_batch()
    forward = ModelForward(model)
    logits = forward(ids, (mask,))
    assert forward.output == "last" and logits.shape == (ids.shape[0], VOCAB)
    full = model(input_ids=ids, attention_mask=mask).logits
    last = mask.sum(1) - 1
    assert torch.allclose(logits, full[torch.arange(len(ids)), last])
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 2, max_steps=3, seed=0, convergence={"until_converged": False}, verbose=False)
    assert dm.attribute(ids, additional_forward_args=(mask,), layer=1).shape == ids.shape
    scores = IntegratedGradients(model).attribute(ids, target=5, additional_forward_args=(mask,), n_steps=4)
    assert scores.shape == ids.shape and (scores[mask == 0] == 0).all()


def test_per_position_logits_of_another_model_must_be_declared():
    model = _bert(hf.BertForMaskedLM)
    ids, mask = token_batch()
    with pytest.raises(ValueError, match="output='last' .* output='all' .* forward_func"):
        DiffMask(model).fit([(ids, mask)], max_steps=1, verbose=False)
    forward = ModelForward(model, output="all")
    logits = forward(ids, (mask,))
    assert logits.shape == (*ids.shape, VOCAB) and (logits[mask == 0] == 0).all()
    dm = DiffMask(model, mode="input", output="all")
    history = dm.fit([(ids, mask)] * 2, max_steps=3, seed=0, convergence={"until_converged": False}, verbose=False)
    assert all(row["kl"] == row["kl"] for row in history)
    masks = PerExampleDiffMask(model, output="all").fit_masks(ids, (mask,), layer=0, steps=2, verbose=False)
    assert masks.kl.shape == (ids.shape[0],)


def test_a_question_answering_head_keeps_its_start_and_end_over_real_positions():
    model = _bert(hf.BertForQuestionAnswering)
    ids, mask = token_batch()
    forward = ModelForward(model)
    logits = forward(ids, (mask,))
    assert forward.output == "span" and logits.shape == (ids.shape[0], 2, ids.shape[1])
    assert (logits[0, :, mask[0] == 0] == torch.finfo(logits.dtype).min).all()  # padding is never a start or end
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 2, max_steps=3, seed=0, convergence={"until_converged": False}, verbose=False)
    assert dm.attribute(ids, additional_forward_args=(mask,), layer=2).shape == ids.shape
    ig = IntegratedGradients(model)
    predicted = ig.attribute(ids, additional_forward_args=(mask,), layer=0, n_steps=4)
    spans = torch.tensor([[0, 1]] * ids.shape[0])
    given = ig.attribute(ids, target=spans, additional_forward_args=(mask,), layer=0, n_steps=4)
    assert predicted.shape == given.shape == ids.shape and not torch.equal(predicted, given)
    with pytest.raises(ValueError, match=r"target must have shape \(4, 2\)"):
        Occlusion(model).attribute(ids, target=torch.tensor([1, 2, 3, 4]), additional_forward_args=(mask,))


def test_an_output_without_logits_is_refused_naming_forward_func():
    class Weird(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 8)

        def forward(self, ids):
            return {"scores": self.embed(ids).sum(-1)}

    with pytest.raises(TypeError, match="forward_func"):
        ModelForward(Weird())(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="output must be one of"):
        ModelForward(Weird(), output="tokens")
