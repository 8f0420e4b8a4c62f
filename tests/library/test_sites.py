import pytest
import torch
from torch import nn

from captum_diffmask import SiteLocator
from captum_diffmask.model.activations import first_tensor, with_first_tensor

from tiny_models import HF_KINDS, tiny_model, token_batch


def _logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).logits


def _hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


EXPECTED_PATHS = {
    "bert": ("bert.embeddings.word_embeddings", "bert.embeddings", "bert.encoder.layer.1"),
    "roberta": ("roberta.embeddings.word_embeddings", "roberta.embeddings", "roberta.encoder.layer.1"),
    "distilbert": ("distilbert.embeddings.word_embeddings", "distilbert.embeddings", "distilbert.transformer.layer.1"),
    "electra": ("electra.embeddings.word_embeddings", "electra.encoder.layer.0", "electra.encoder.layer.1"),
    "gpt2": ("transformer.wte", "transformer.h.0", "transformer.h.1"),
}


@pytest.mark.parametrize("kind", HF_KINDS)
def test_registry_locates_l_plus_2_sites(kind):
    model = tiny_model(kind)
    locator = SiteLocator.locate(model)
    assert locator.names == ["input", "hidden.0", "hidden.1", "hidden.2"]
    assert locator.num_layers == 2
    described = locator.describe()
    assert (described[0][1], described[1][1], described[-1][1]) == EXPECTED_PATHS[kind]


@pytest.mark.parametrize("kind", HF_KINDS)
def test_identity_replacement_leaves_logits_unchanged_and_zeros_change_them(kind):
    model = tiny_model(kind)
    locator = SiteLocator.locate(model)
    ids, mask = token_batch()
    with torch.no_grad():
        with locator.capture() as states:
            original = _logits(model, ids, mask)
        assert set(states) == set(locator.names)
        assert states["hidden.2"].shape[:2] == ids.shape
        with locator.replace({name: states[name].clone() for name in locator.names}):
            replayed = _logits(model, ids, mask)
        assert torch.allclose(replayed, original, atol=1e-5)
        for name in locator.names:
            with locator.replace({name: torch.zeros_like(states[name])}):
                zeroed = _logits(model, ids, mask)
            assert (zeroed - original).abs().max() > 1e-3, name
    assert _hook_count(model) == 0


def test_replacing_hidden_k_changes_later_sites_only(bert):
    locator = SiteLocator.locate(bert)
    ids, mask = token_batch()
    with torch.no_grad(), locator.capture() as clean:
        _logits(bert, ids, mask)
    with torch.no_grad(), locator.replace({"hidden.1": torch.zeros_like(clean["hidden.1"])}):
        with locator.capture() as dirty:
            _logits(bert, ids, mask)
    assert torch.equal(dirty["hidden.0"], clean["hidden.0"])
    assert torch.equal(dirty["hidden.1"], torch.zeros_like(clean["hidden.1"]))  # capture sees the replacement
    assert not torch.allclose(dirty["hidden.2"], clean["hidden.2"])


def test_callable_replacement_and_shape_check(bert):
    locator = SiteLocator.locate(bert)
    ids, mask = token_batch()
    with torch.no_grad():
        original = _logits(bert, ids, mask)
        with locator.replace({"hidden.1": lambda h: h * 1.0}):
            assert torch.allclose(_logits(bert, ids, mask), original, atol=1e-6)
        with pytest.raises(ValueError, match="hidden.1"):
            with locator.replace({"hidden.1": torch.zeros(1, 2, 3)}):
                _logits(bert, ids, mask)
    assert _hook_count(bert) == 0


def test_no_hook_survives_an_exception(bert):
    locator = SiteLocator.locate(bert)
    ids, mask = token_batch()

    class Boom(RuntimeError):
        pass

    def explode(h):
        raise Boom()

    with pytest.raises(Boom):
        with locator.capture():
            with locator.replace({"hidden.1": explode}):
                _logits(bert, ids, mask)
    assert _hook_count(bert) == 0
    with pytest.raises(Boom):
        with locator.capture():
            raise Boom()
    assert _hook_count(bert) == 0


def test_stop_early_skips_the_rest_of_the_model(bert):
    locator = SiteLocator.locate(bert)
    ids, mask = token_batch()
    reached = []
    handle = bert.classifier.register_forward_hook(lambda *a: reached.append(True))
    try:
        with torch.no_grad(), locator.capture(["input", "hidden.1"], stop_early=True) as states:
            _logits(bert, ids, mask)
            reached.append("after")  # not run: the forward pass was aborted
    finally:
        handle.remove()
    assert set(states) == {"input", "hidden.1"} and reached == []
    assert _hook_count(bert) == 0  # ours is removed


class TupleBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, hidden, scale=1.0):
        return (torch.tanh(self.linear(hidden)) * scale, "extra")


class TinyStack(nn.Module):
    """A non-HF model with tuple-returning blocks, called with keyword inputs."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.blocks = nn.ModuleList(TupleBlock() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, ids):
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden=hidden)[0]
        return self.head(hidden.mean(1))


def test_generic_fallback_with_tuple_outputs_and_keyword_inputs():
    torch.manual_seed(0)
    model = TinyStack()
    locator = SiteLocator.locate(model)
    assert [d[1:] for d in locator.describe()] == [
        ("embed", "output"), ("blocks.0", "input"), ("blocks.0", "output"),
        ("blocks.1", "output"), ("blocks.2", "output"),
    ]
    ids = torch.randint(0, 20, (3, 5))
    with torch.no_grad():
        with locator.capture() as states:
            original = model(ids)
        assert torch.equal(states["hidden.0"], states["input"])  # keyword input read
        with locator.replace({n: states[n].clone() for n in locator.names}):
            assert torch.allclose(model(ids), original, atol=1e-6)
        with locator.replace({"hidden.0": torch.zeros_like(states["hidden.0"])}):
            assert not torch.allclose(model(ids), original)


def test_explicit_sites_by_module_and_path():
    model = TinyStack()
    by_path = SiteLocator.locate(model, {"input": "embed", "hidden": ["embed", "blocks.1", ("blocks.2", "output")]})
    by_module = SiteLocator.locate(model, {"input": model.embed, "hidden": [model.embed, model.blocks[1], model.blocks[2]]})
    assert by_path.describe() == by_module.describe()
    assert by_path.num_layers == 2


def test_errors_name_the_argument_and_say_how_to_pass_sites():
    no_blocks = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="sites=.*'input'.*'hidden'"):
        SiteLocator.locate(no_blocks)
    with pytest.raises(ValueError, match="nope"):
        SiteLocator.locate(no_blocks, {"input": "nope", "hidden": ["1"]})
    with pytest.raises(ValueError, match="'input' and 'hidden'"):
        SiteLocator.locate(no_blocks, {"inputs": "0"})
    with pytest.raises(ValueError, match="unknown site"):
        SiteLocator.locate(TinyStack()).site("hidden.9")


def test_container_helpers_keep_the_container_type():
    from transformers.modeling_outputs import BaseModelOutput

    h, new = torch.zeros(2), torch.ones(2)
    assert with_first_tensor(h, new) is new
    assert with_first_tensor((h, 1), new)[1] == 1
    out = with_first_tensor(BaseModelOutput(last_hidden_state=h), new)
    assert isinstance(out, BaseModelOutput) and torch.equal(out.last_hidden_state, new)
    assert first_tensor(out) is new
    with pytest.raises(TypeError):
        first_tensor("text")


def test_a_model_whose_blocks_run_tokens_first_is_read_and_replaced_batch_first():
    from transformers import XLNetConfig, XLNetForSequenceClassification

    from captum_diffmask.methods import IntegratedGradients
    from tiny_models import token_batch, VOCAB

    torch.manual_seed(0)
    model = XLNetForSequenceClassification(XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2,
                                                       d_inner=37, num_labels=3)).eval()
    ids, mask = token_batch()  # (4, 9): tokens first would be (9, 4)
    ig = IntegratedGradients(model)
    scores = ig.attribute(ids, additional_forward_args=(mask,), layer=1, n_steps=4)
    assert scores.shape == ids.shape and ig.locator.site("hidden.1").tokens_first  # found by the self-check
    call = ig._prepare(ids, (mask,), 1)
    states, logits = ig.capture(call, ["hidden.1"])
    with torch.no_grad():
        own = model(ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    assert torch.allclose(states["hidden.1"][real], own.hidden_states[1][real], atol=1e-5)
    with torch.no_grad():  # a site replaced by itself, put back tokens first: the same logits
        same = ig.replaced_logits(call, {"hidden.1": states["hidden.1"]})
    assert torch.allclose(same, own.logits, atol=1e-5) and torch.allclose(logits, own.logits, atol=1e-5)
