"""Heads and MLP units located by one rule, read and gated at the input of their
projection; a closed gate is checked against silencing the component by hand in
the model's own weights."""

import copy

import pytest
import torch

from captum_diffmask.model.components import gate_components, locate_components, read_components

from tiny_models import sensitized, tiny_bert, tiny_causal_lm, token_batch



MODELS = {"bert": lambda: sensitized(tiny_bert()), "gpt2": lambda: sensitized(tiny_causal_lm("gpt2")),
          "llama": lambda: sensitized(tiny_causal_lm("llama"))}
PROJECTIONS = {
    "bert": ("bert.encoder.layer.{}.attention.output.dense", "bert.encoder.layer.{}.output.dense"),
    "gpt2": ("transformer.h.{}.attn.c_proj", "transformer.h.{}.mlp.c_proj"),
    "llama": ("model.layers.{}.self_attn.o_proj", "model.layers.{}.mlp.down_proj"),
}


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _silenced_by_hand(model, name, kind, layer, index):
    r"""A copy of ``model`` whose component ``index`` of block ``layer`` (from 1)
    outputs zero: a head's value projection, or a unit's input row, zeroed."""
    silenced = copy.deepcopy(model)
    block = {"bert": lambda m: m.bert.encoder.layer, "gpt2": lambda m: m.transformer.h,
             "llama": lambda m: m.model.layers}[name](silenced)[layer - 1]
    with torch.no_grad():
        if kind == "heads":
            size = 16  # hidden 32, 2 heads
            rows = slice(index * size, (index + 1) * size)
            if name == "bert":
                block.attention.self.value.weight[rows] = 0
                block.attention.self.value.bias[rows] = 0
            elif name == "gpt2":  # c_attn's columns: query, key, value
                block.attn.c_attn.weight[:, 64 + index * size: 64 + (index + 1) * size] = 0
                block.attn.c_attn.bias[64 + index * size: 64 + (index + 1) * size] = 0
            else:
                block.self_attn.v_proj.weight[rows] = 0
        else:  # the activation of 0 is 0 (GELU, GELU-new; SiLU(gate) * 0)
            if name == "bert":
                block.intermediate.dense.weight[index] = 0
                block.intermediate.dense.bias[index] = 0
            elif name == "gpt2":
                block.mlp.c_fc.weight[:, index] = 0
                block.mlp.c_fc.bias[index] = 0
            else:
                block.mlp.up_proj.weight[index] = 0
    return silenced


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kind", ["heads", "units"])
def test_located_by_one_rule(name, kind):
    model = MODELS[name]()
    sites = locate_components(model, kind)
    modules = {id(module): path for path, module in model.named_modules()}
    expected = PROJECTIONS[name][0 if kind == "heads" else 1]
    assert [modules[id(site.module)] for site in sites] == [expected.format(k) for k in range(2)]
    assert [site.name for site in sites] == [f"{kind}.1", f"{kind}.2"]
    units = {"bert": 37, "gpt2": 128, "llama": 37}[name]
    assert all((site.count, site.width) == ((2, 16) if kind == "heads" else (units, 1)) for site in sites)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kind", ["heads", "units"])
def test_a_closed_gate_silences_the_component_as_zeroing_its_weights_does(name, kind):
    model = MODELS[name]()
    ids, mask = token_batch(seed=3)
    sites = locate_components(model, kind)
    count = sites[0].count
    for layer, index in ((1, 1), (2, 0)):
        gates = {site.name: torch.ones(ids.shape[0], count) for site in sites}
        gates[f"{kind}.{layer}"][:, index] = 0.0
        with gate_components(sites, gates):
            gated = _logits(model, ids, mask)
        by_hand = _logits(_silenced_by_hand(model, name, kind, layer, index), ids, mask)
        assert (gated - by_hand).abs().max() < 1e-5, (name, kind, layer, index)
        assert (gated - _logits(model, ids, mask)).abs().max() > 1e-2  # the component mattered
    with gate_components(sites, {site.name: torch.ones(ids.shape[0], ids.shape[1], count) for site in sites}):
        assert torch.equal(_logits(model, ids, mask), _logits(model, ids, mask))
    assert all(not site.module._forward_pre_hooks for site in sites)


def test_reading_sees_the_gated_components_and_the_baseline_fills_a_closed_one():
    model = tiny_bert()
    ids, mask = token_batch()
    sites = locate_components(model, "heads")
    with read_components(sites) as seen:
        _logits(model, ids, mask)
    assert seen["heads.1"].shape == (ids.shape[0], ids.shape[1], 2, 16)
    baseline = torch.arange(32.0).view(2, 16)
    gates = {"heads.1": torch.tensor([[0.0, 1.0]]).expand(ids.shape[0], 2), "heads.2": torch.ones(ids.shape[0], 2)}
    with gate_components(sites, gates, {"heads.1": baseline}), read_components(sites) as gated:
        _logits(model, ids, mask)
    assert torch.equal(gated["heads.1"][:, :, 0], baseline[0].expand(ids.shape[0], ids.shape[1], 16))
    assert torch.allclose(gated["heads.1"][:, :, 1], seen["heads.1"][:, :, 1])


def test_gradients_reach_the_gates_and_hooks_go_when_the_forward_raises():
    model = tiny_bert()
    ids, mask = token_batch()
    sites = locate_components(model, "units")
    gates = {site.name: torch.full((ids.shape[0], site.count), 0.5, requires_grad=True) for site in sites}
    with gate_components(sites, gates):
        model(input_ids=ids, attention_mask=mask).logits.sum().backward()
    assert all(gates[name].grad.abs().sum() > 0 for name in gates)
    with pytest.raises(RuntimeError, match="boom"):
        with gate_components(sites, {site.name: torch.ones(1, site.count) for site in sites}):
            raise RuntimeError("boom")
    assert all(not site.module._forward_pre_hooks for site in sites)


def test_bad_arguments_are_named():
    model = tiny_bert()
    with pytest.raises(ValueError, match="kind"):
        locate_components(model, "neurons")
    sites = locate_components(model, "heads")
    with pytest.raises(ValueError, match="gates"):
        with gate_components(sites, {"heads.1": torch.ones(1, 2)}):
            pass


def test_named_components_give_the_sites_the_rule_finds():
    from captum_diffmask.model.components import named_components

    model = tiny_bert()
    for kind, spec in (("heads", lambda b: (b.attention.output.dense, 2)), ("units", lambda b: b.output.dense)):
        named = named_components(kind, {k + 1: spec(b) for k, b in enumerate(model.bert.encoder.layer)}, 2)
        assert named == locate_components(model, kind)
    block = model.bert.encoder.layer[0]
    # any module, with its count and width given
    site = named_components("heads", {1: (block.attention.output.dense, 4, 8), 2: (block.output.dense, 37, 1)}, 2)[0]
    assert (site.name, site.count, site.width) == ("heads.1", 4, 8)


@pytest.mark.parametrize("specs, match", [
    (lambda b: {1: (b.attention.output.dense, 2)}, r"every block 1\.\.2"),
    (lambda b: {1: b.attention.output.dense, 2: b.attention.output.dense}, r"components\[1\]: give the number of heads"),
    (lambda b: {1: (b.attention.output.dense, 3), 2: (b.attention.output.dense, 2)}, r"components\[1\]: .*do not fill"),
    (lambda b: {1: (torch.nn.Identity(), 2), 2: (torch.nn.Identity(), 2)}, r"components\[1\]: width must be an int"),
    (lambda b: {1: ("dense", 2), 2: ("dense", 2)}, r"components\[1\]: give a module"),
])
def test_named_components_name_what_is_wrong(specs, match):
    from captum_diffmask.model.components import named_components

    block = tiny_bert().bert.encoder.layer[0]
    with pytest.raises(ValueError, match=match):
        named_components("heads", specs(block), 2)
