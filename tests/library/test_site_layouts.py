"""Models whose blocks do not run on (B, T, H) states of the ids: the sites are
read as (B, T, H) on the ids' positions and replaced in the model's own layout.

Each model is config-built and tiny. For each: the layout the self-check learnt,
the sites against the model's own ``hidden_states`` (in the layout the library
shows), a site replaced by itself giving the model's own logits, and scores of
the ids' shape with 0 at padding.
"""

from __future__ import annotations

from typing import Tuple

import pytest
import torch
import transformers as hf

from captum_diffmask.methods import Occlusion
from tiny_models import token_batch, VOCAB


def _squeezebert() -> torch.nn.Module:
    config = hf.SqueezeBertConfig(vocab_size=VOCAB, hidden_size=32, embedding_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, num_labels=3, q_groups=2, k_groups=2,
                                  v_groups=2, post_attention_groups=1, intermediate_groups=2, output_groups=2)
    return hf.SqueezeBertForSequenceClassification(config)


def _deepseek_v4() -> torch.nn.Module:
    config = hf.DeepseekV4Config(vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, head_dim=16, q_lora_rank=16,
                                 num_experts_per_tok=1, n_routed_experts=4, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)
    return hf.DeepseekV4ForCausalLM(config)


def _gemma3n() -> torch.nn.Module:
    config = hf.Gemma3nTextConfig(vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=2, head_dim=16, hidden_size_per_layer_input=8, laurel_rank=8,
                                  num_kv_shared_layers=0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return hf.Gemma3nForCausalLM(config)


def _cpmant() -> torch.nn.Module:
    config = hf.CpmAntConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, dim_head=16, dim_ff=64,
                             num_hidden_layers=2, prompt_length=4, prompt_types=4, segment_types=4, init_std=0.02)
    return hf.CpmAntForCausalLM(config)


def _prophetnet() -> torch.nn.Module:
    config = hf.ProphetNetConfig(vocab_size=VOCAB, hidden_size=32, decoder_ffn_dim=64, num_decoder_layers=2,
                                 num_decoder_attention_heads=2, ngram=2, is_decoder=True, is_encoder_decoder=False,
                                 add_cross_attention=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return hf.ProphetNetForCausalLM(config)


def _longformer() -> torch.nn.Module:
    config = hf.LongformerConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, attention_window=4, num_labels=3, max_position_embeddings=64,
                                 pad_token_id=1)
    return hf.LongformerForSequenceClassification(config)


def _own_hidden_states(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states


def _side_by_side(state: torch.Tensor, streams: str) -> torch.Tensor:
    if streams == "first":  # (S, B, T, H)
        state = state.permute(1, 2, 0, 3)
    return state.flatten(2) if state.dim() == 4 else state


LAYOUTS = {
    # model, what the self-check must learn (a Site attribute and its value)
    "squeezebert (B, H, T), blocks called past their hooks": (_squeezebert, "features_first", True),
    "deepseek-v4 streams (B, T, S, H)": (_deepseek_v4, "streams", "after_tokens"),
    "gemma-3n streams (S, B, T, H)": (_gemma3n, "streams", "first"),
    "cpm-ant prompt before the ids": (_cpmant, "window", (4, 1)),
    "prophetnet n-gram streams after the ids": (_prophetnet, "window", (0, 3)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_sites_are_the_models_own_states_in_its_layout(name: str) -> None:
    build, attribute, value = LAYOUTS[name]
    torch.manual_seed(0)
    model = build().eval()
    ids, mask = token_batch()
    occlusion = Occlusion(model)
    scores = occlusion.attribute(ids, additional_forward_args=(mask,), layer=1)
    assert scores.shape == ids.shape and bool((scores[mask == 0] == 0).all())
    assert getattr(occlusion.locator.site("hidden.1"), attribute) == value  # learnt by the self-check

    call = occlusion._prepare(ids, (mask,), 1)
    names = [f"hidden.{k}" for k in range(occlusion.num_layers)]
    states, logits = occlusion.capture(call, names)
    own = _own_hidden_states(model, ids, mask)
    streams = occlusion.locator.site("hidden.0").streams
    real = mask.bool()
    for k, site in enumerate(names):
        assert states[site].shape[:2] == ids.shape
        assert torch.allclose(states[site][real], _side_by_side(own[k], streams)[real], atol=1e-4)
    with torch.no_grad():  # each site replaced by itself, put back in the model's layout: the same logits
        for site in names:
            same = occlusion.replaced_logits(call, {site: states[site]})
            assert torch.allclose(same, logits, atol=1e-5)


def test_a_changed_token_changes_every_stream_of_that_token_only() -> None:
    torch.manual_seed(0)
    model = _deepseek_v4().eval()
    ids, mask = token_batch()
    occlusion = Occlusion(model)
    occlusion.attribute(ids, additional_forward_args=(mask,), layer=1)
    seen = []
    hook = model.model.layers[1].register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    try:
        call = occlusion._prepare(ids, (mask,), 1)
        states, _ = occlusion.capture(call, ["hidden.1"])
        changed = states["hidden.1"].clone()
        changed[0, 2] = 0.0
        with torch.no_grad():
            occlusion.replaced_logits(call, {"hidden.1": changed})
    finally:
        hook.remove()
    block_input = seen[-1]  # (B, T, S, H), as the model runs it
    assert bool((block_input[0, 2] == 0).all())
    assert not bool((block_input[0, 3] == 0).any()) and not bool((block_input[1] == 0).any())


@pytest.mark.parametrize("length", [9, 8])
def test_a_model_that_pads_to_its_window_is_padded_first_and_scored_on_the_ids(length: int) -> None:
    torch.manual_seed(0)
    model = _longformer().eval()
    ids, mask = token_batch(length=length)  # 9 is no multiple of the window (4), 8 is
    occlusion = Occlusion(model)
    scores = occlusion.attribute(ids, additional_forward_args=(mask,), layer=1)
    assert scores.shape == ids.shape and bool((scores[mask == 0] == 0).all())
    call = occlusion._prepare(ids, (mask,), 1)
    assert call.ids.shape[1] % 4 == 0 and (call.length == length) == (length % 4 != 0)
    states, logits = occlusion.capture(call, ["hidden.1"])
    own = _own_hidden_states(model, ids, mask)
    real = mask.bool()
    assert torch.allclose(states["hidden.1"][:, :length][real], own[1][real], atol=1e-4)
    with torch.no_grad():
        assert torch.allclose(logits, model(input_ids=ids, attention_mask=mask).logits, atol=1e-4)


@pytest.mark.parametrize("codebooks", [1, 2])
def test_one_embedding_table_per_codebook(codebooks: int) -> None:
    config = hf.MusicgenDecoderConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                      num_attention_heads=2, num_codebooks=codebooks, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = hf.MusicgenForCausalLM(config).eval()
    if codebooks > 1:
        with pytest.raises(ValueError, match=r"MusicgenForCausalLM.*2 embedding tables.*sites="):
            Occlusion(model)
        return
    occlusion = Occlusion(model)
    assert occlusion.locator.site("input").module is model.model.decoder.embed_tokens[0]
    ids, mask = token_batch()
    assert occlusion.attribute(ids, additional_forward_args=(mask,), layer=0).shape == ids.shape


def test_diffmask_on_a_model_that_pads_to_its_window_fits_and_answers_on_the_ids() -> None:
    from captum_diffmask import DiffMask

    torch.manual_seed(0)
    model = _longformer().eval()
    ids, mask = token_batch()  # T = 9, padded to 12 inside the library
    explainer = DiffMask(model, mode="hidden")
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(len(ids), dtype=torch.long)}
    explainer.fit([batch], max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    scores = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert scores.shape == (*ids.shape, explainer.num_layers + 1) and bool((scores[mask == 0] == 0).all())
    gates, masked, original = explainer.masked_forward(ids, additional_forward_args=(mask,), layer=1)
    assert gates.shape == ids.shape and masked.shape == original.shape == (len(ids), 3)
