"""Every common family, config-built and tiny: the sites are found and pass the
self-check against the model's own hidden states, and DiffMask fits and
attributes in both modes with (B, T) scores in [0, 1] and 0 on padding."""

import pytest
import torch
import transformers as hf

from captum_diffmask import DiffMask
from captum_diffmask.model.sites import SiteLocator

from tiny_models import tiny_model, token_batch, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")

SMALL = dict(num_attention_heads=2, num_labels=3)
FAMILIES = {
    "albert": lambda: hf.AlbertForSequenceClassification(hf.AlbertConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3, intermediate_size=37, **SMALL)),
    "llama": lambda: hf.LlamaForSequenceClassification(hf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, intermediate_size=37,
        pad_token_id=0, **SMALL)),
    "qwen2": lambda: hf.Qwen2ForSequenceClassification(hf.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, intermediate_size=37,
        pad_token_id=0, **SMALL)),
    "modernbert": lambda: hf.ModernBertForSequenceClassification(hf.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=37, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, **SMALL)),
    "t5": lambda: hf.T5ForSequenceClassification(hf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=2,
        num_labels=3, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
    "bart": lambda: hf.BartForSequenceClassification(hf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, num_labels=3, pad_token_id=1,
        eos_token_id=2, max_position_embeddings=64)),
    # encoder-only families that transformers 5 gives a get_encoder() too: found by
    # the generic rule, not sent down the encoder-decoder branch
    "deberta": lambda: hf.DebertaForSequenceClassification(hf.DebertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=37, **SMALL)),
    "deberta-v2": lambda: hf.DebertaV2ForSequenceClassification(hf.DebertaV2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=37, **SMALL)),
    "mpnet": lambda: hf.MPNetForSequenceClassification(hf.MPNetConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=37, **SMALL)),
    "camembert": lambda: hf.CamembertForSequenceClassification(hf.CamembertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=37, pad_token_id=1,
        max_position_embeddings=70, **SMALL)),
    "big_bird": lambda: hf.BigBirdForSequenceClassification(hf.BigBirdConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=37, attention_type="original_full",
        max_position_embeddings=64, **SMALL)),
}
#: the end-of-sequence token the encoder-decoder heads pool on, and their padding id
EOS = {"t5": (1, 0), "bart": (2, 1)}
ALL = ["bert", "distilbert", "roberta", "electra", "gpt2"] + list(FAMILIES)


def _model(name):
    torch.manual_seed(0)
    return tiny_model(name) if name not in FAMILIES else FAMILIES[name]().eval()


def _batch(name):
    ids, mask = token_batch()
    ids = ids.clamp(min=3)
    if name in EOS:  # one end-of-sequence token per row, at its last real position
        eos, pad = EOS[name]
        lengths = mask.sum(1)
        ids[torch.arange(len(ids)), lengths - 1] = eos
        ids[mask == 0] = pad
    else:
        ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("mode", ["input", "hidden"])
@pytest.mark.parametrize("name", ALL)
def test_fit_and_attribute_on_every_family(name, mode):
    model = _model(name)
    ids, mask = _batch(name)
    dm = DiffMask(model, mode=mode)
    dm.fit([(ids, mask)] * 2, max_steps=4, seed=0, convergence={"until_converged": False}, verbose=False)
    assert dm._sites_checked  # the self-check ran on the first batch and passed
    scores = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert scores.shape == (*ids.shape, dm.num_layers + 1)
    assert ((scores >= 0) & (scores <= 1)).all() and (scores[mask == 0] == 0).all()
    layers = getattr(model.config, "num_hidden_layers", None) or model.config.num_layers
    if name in ("t5", "bart"):  # the encoder's layers, although the decoder has more
        layers = getattr(model.config, "encoder_layers", None) or model.config.num_layers
    assert dm.num_layers == layers


def test_albert_gets_one_site_per_run_of_its_shared_block_and_they_match_its_hidden_states():
    model = _model("albert")
    ids, mask = _batch("albert")
    locator = SiteLocator.locate(model)
    assert locator.num_layers == 3
    assert [path for _, path, _ in locator.describe()[2:]] == [f"albert.encoder.albert_layer_groups.0#{k}" for k in range(3)]
    with torch.no_grad(), locator.capture() as states:
        own = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for k in range(4):
        assert torch.allclose(states[f"hidden.{k}"], own[k], atol=1e-5)


def test_encoder_decoders_use_the_encoder_and_its_own_embedding_calls():
    for name in ("t5", "bart"):
        model = _model(name)
        paths = [path for _, path, _ in SiteLocator.locate(model).describe()]
        assert all(".encoder." in path for path in paths), paths


def _swapped_blocks():
    r"""A tiny BERT with its two blocks named in the wrong order, and a batch."""
    model = _model("bert")
    blocks = list(model.bert.encoder.layer)
    wrong = {"input": model.bert.embeddings.word_embeddings, "hidden": [model.bert.embeddings, blocks[1], blocks[0]]}
    return DiffMask(model, mode="hidden", sites=wrong), _batch("bert")


@pytest.mark.parametrize("name, build, error", [
    ("funnel", lambda: hf.FunnelForSequenceClassification(hf.FunnelConfig(
        vocab_size=VOCAB, d_model=32, n_head=2, d_head=16, d_inner=37, block_sizes=[1, 1], num_labels=3)),
     # its blocks (lists) run past their hooks: read inside them, the pooled states are refused
     r"hidden.2 \(read at funnel.encoder.blocks.1.0\) holds activations of shape \(4, 5, 32\) in "
     r"FunnelForSequenceClassification.*pool the tokens"),
])  # XLNet and SqueezeBERT, once refused here, are read in their layouts: tests/library/test_site_layouts.py
def test_families_the_generic_rule_gets_wrong_are_refused_naming_the_model_and_what_to_pass(name, build, error):
    torch.manual_seed(0)
    model = build().eval()
    ids, mask = _batch(name)
    with pytest.raises(ValueError, match=error + ".*sites="):
        DiffMask(model, mode="hidden").fit([(ids, mask)], max_steps=1, verbose=False)


def test_sites_that_are_not_the_models_hidden_states_are_refused():
    dm, (ids, mask) = _swapped_blocks()
    with pytest.raises(ValueError, match=r"hidden.1 \(read at bert.encoder.layer.1\) is not the model's own hidden_states\[1\]"):
        dm.fit([(ids, mask)], max_steps=1, verbose=False)


def test_a_failed_self_check_fails_again_on_the_next_call():
    dm, (ids, mask) = _swapped_blocks()
    for _ in range(2):
        with pytest.raises(ValueError, match="is not the model's own hidden_states"):
            dm.fit([(ids, mask)], max_steps=1, verbose=False)


class _TorchEncoder(torch.nn.Module):
    """PyTorch's own nn.TransformerEncoder, whose fast path (eval mode, a padding
    mask) runs the layers on nested tensors."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        layer = torch.nn.TransformerEncoderLayer(32, 2, 37, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2)
        self.head = torch.nn.Linear(32, 3)

    def forward(self, ids, mask):
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=~mask.bool())[:, 0])


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_pytorchs_own_transformer_encoder_works_given_its_layers(mode):
    torch.manual_seed(0)
    model = _TorchEncoder().eval()
    ids, mask = token_batch()
    sites = {"input": model.embed, "hidden": [(model.encoder.layers[0], "input")] + list(model.encoder.layers)}
    dm = DiffMask(model, mode=mode, sites=sites, padding_mask_arg=0)
    dm.fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    scores = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert scores.shape == (*ids.shape, 3) and (scores[mask == 0] == 0).all()
    assert ((scores > 0) & (scores <= 1))[mask == 1].all()
    assert torch.backends.mha.get_fastpath_enabled()  # the fast path is the user's again
