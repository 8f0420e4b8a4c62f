"""The attention baseline (captum_diffmask.methods.attention): what each token
receives at block k, max over heads and mean over the real queries."""

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from captum_diffmask.methods import AttentionWeights

from tiny_models import token_batch, VOCAB


def _bert(implementation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, num_labels=3, max_position_embeddings=64)
    config._attn_implementation = implementation
    return BertForSequenceClassification(config).eval()


def test_the_scores_are_the_received_attention_by_hand_at_every_block_and_at_one():
    model = _bert("eager")
    ids, mask = token_batch()
    method = AttentionWeights(model)
    every = method.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert every.shape == (*ids.shape, 2) and method.attributes_every_layer()
    assert (every >= 0).all() and (every[mask == 0] == 0).all() and (every[mask == 1] > 0).all()
    with torch.no_grad():
        attentions = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for b in range(ids.shape[0]):
        real = mask[b].bool()
        for block in range(2):
            expected = attentions[block][b][:, real][:, :, real].max(0).values.mean(0)  # max heads, mean queries
            assert torch.allclose(every[b, real, block], expected, atol=1e-6)
    second = method.attribute(ids, additional_forward_args=(mask,), layer=2)
    assert torch.equal(second, every[..., 1])


def test_layer_0_a_target_and_attention_without_weights_are_refused_by_name():
    ids, mask = token_batch()
    method = AttentionWeights(_bert("eager"))
    with pytest.raises(ValueError, match="layer: attention weights exist at the blocks 1..2"):
        method.attribute(ids, additional_forward_args=(mask,), layer=0)
    with pytest.raises(ValueError, match="layer must be in 0..2"):
        method.attribute(ids, additional_forward_args=(mask,), layer=3)
    with pytest.raises(ValueError, match="target must be None"):
        method.attribute(ids, target=1, additional_forward_args=(mask,), layer=1)
    sdpa = _bert("sdpa")
    with torch.no_grad():
        if sdpa(input_ids=ids, attention_mask=mask, output_attentions=True).attentions:
            pytest.skip("this transformers version returns attention weights with SDPA")
    with pytest.raises(ValueError, match="eager"):
        AttentionWeights(sdpa).attribute(ids, additional_forward_args=(mask,), layer=1)
    with pytest.raises(ValueError, match="Hugging Face"):
        AttentionWeights(torch.nn.Linear(2, 2))
