"""Question-answering heads: every method keeps the start and end distributions
over the real positions, the KL sums the two, and the question/context segments
reach every forward pass."""

import pytest
import torch
import torch.nn.functional as F
import transformers as hf

from captum_diffmask import DiffMask
from captum_diffmask.model.forward import ModelForward
from captum_diffmask.methods import IntegratedGradients
from captum_diffmask.model.divergences import example_kl, log_probs

from tiny_models import every_method, prepared_method, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
CLS, SEP = 1, 2
LAYERS = (0, 2)  # the embeddings and the last block's output
METHODS = every_method({"n_steps": 8})


def _qa_model():
    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
    return hf.BertForQuestionAnswering(config).eval()


def _qa_batch():
    r"""``[CLS] question [SEP] context [SEP]``, right-padded: ids, attention mask
    and token type ids (0 for the question, 1 for the context), all (3, 12)."""
    pairs = [([7, 8], [20, 21, 22, 23, 24, 25, 26]), ([9, 10, 11], [30, 31, 32]), ([12], [40, 41, 42, 43])]
    rows = [[CLS, *q, SEP, *c, SEP] for q, c in pairs]
    types = [[0] * (len(q) + 2) + [1] * (len(c) + 1) for q, c in pairs]
    width = max(len(r) for r in rows) + 1  # every row has padding
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    token_types = torch.tensor([t + [0] * (width - len(t)) for t in types])
    return ids, mask, token_types


def test_the_kept_output_is_start_and_end_over_real_positions_with_the_segments():
    model = _qa_model()
    ids, mask, types = _qa_batch()
    forward = ModelForward(model)
    logits = forward(ids, (mask, types))
    assert forward.output == "span" and logits.shape == (3, 2, ids.shape[1])
    direct = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()
    assert torch.equal(logits[:, 0][real], direct.start_logits[real])
    assert torch.equal(logits[:, 1][real], direct.end_logits[real])
    # the segments change the model's output, so they must be the ones fed
    without = model(input_ids=ids, attention_mask=mask).start_logits
    assert not torch.allclose(without[real], direct.start_logits[real], atol=1e-4)
    assert (logits[:, :, :][~real.unsqueeze(1).expand_as(logits)] == torch.finfo(logits.dtype).min).all()


def test_the_span_kl_is_the_sum_of_the_start_and_end_kls_over_real_positions():
    model = _qa_model()
    ids, mask, types = _qa_batch()
    dm = DiffMask(model, mode="hidden", init_bias=-2.0)  # gates start closed: the masked output differs
    dm.fit([(ids, mask, types)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    with torch.no_grad():
        _, masked, original = dm.masked_forward(ids, (mask, types), layer=1)
        plain = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    kl = example_kl(log_probs(original), log_probs(masked))
    hand = []
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        total = 0.0
        for j, head in enumerate((plain.start_logits, plain.end_logits)):
            assert torch.allclose(original[b, j, :n], head[b, :n], atol=1e-5)
            p, q = F.softmax(head[b, :n].double(), -1), F.softmax(masked[b, j, :n].double(), -1)
            total += float((p * (p / q).log()).sum())
        hand.append(total)
    assert torch.allclose(kl.double(), torch.tensor(hand, dtype=torch.float64), atol=1e-5)
    assert float(kl.max()) > 1e-4  # the masked model differs: the comparison is not 0 == 0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_gives_the_contracts_shape_and_right_padding_changes_nothing(name):
    model = _qa_model()
    ids, mask, types = _qa_batch()
    method, options = prepared_method(METHODS, name, model, (ids, mask, types), LAYERS)
    for layer in LAYERS:
        torch.manual_seed(0)
        batch = method.attribute(ids, additional_forward_args=(mask, types), layer=layer, **options)
        assert batch.shape == ids.shape and torch.isfinite(batch).all()
        assert (batch[mask == 0] == 0).all()
        if name == "Random":
            continue
        n = int(mask[1].sum())
        torch.manual_seed(0)
        alone = method.attribute(ids[1:2, :n], additional_forward_args=(mask[1:2, :n], types[1:2, :n]), layer=layer,
                                 **options)
        tolerance = {"atol": 1e-5, "rtol": 0} if METHODS[name][2] else {"atol": 1e-3, "rtol": 1e-2}
        assert torch.allclose(batch[1, :n], alone[0], **tolerance), (batch[1, :n], alone[0])


def test_gradient_methods_take_a_start_and_end_per_example():
    model = _qa_model()
    ids, mask, types = _qa_batch()
    ig = IntegratedGradients(model)
    spans = torch.tensor([[4, 6], [5, 5], [3, 4]])
    given = ig.attribute(ids, target=spans, additional_forward_args=(mask, types), n_steps=8)
    swapped = ig.attribute(ids, target=spans.flip(-1), additional_forward_args=(mask, types), n_steps=8)
    assert given.shape == ids.shape and not torch.allclose(given, swapped)
    with pytest.raises(ValueError, match=r"target must have shape \(3, 2\)"):
        ig.attribute(ids, target=torch.tensor([1, 2, 3]), additional_forward_args=(mask, types), n_steps=4)
