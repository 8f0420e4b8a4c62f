"""tracr's compiled transformers in PyTorch: the converted model computes what the
compiled one does, layer by layer, and the components each program uses are read
from the compiled weights."""

import numpy as np
import pytest
import torch

pytest.importorskip("tracr")

from benchmarks.tasks.tracr_models import (
    compile_program, convert, DISTINCT_TOKENS, PROGRAMS, used_components, weights_of,
)


def _inputs(name, count=6, seed=0):
    _, vocabulary, length = PROGRAMS[name]
    rng = np.random.default_rng(seed)
    for _ in range(count):
        size = int(rng.integers(1, length))  # BOS plus 1 .. length - 1 tokens
        picks = rng.permutation(len(vocabulary))[:size] if name in DISTINCT_TOKENS else rng.integers(len(vocabulary), size=size)
        yield ["BOS"] + [vocabulary[i] for i in picks]


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def compiled(request):
    assembled = compile_program(request.param)
    return request.param, assembled, convert(assembled), weights_of(assembled)


def test_the_converted_model_computes_the_compiled_ones_residuals_and_outputs(compiled):
    name, assembled, model, weights = compiled
    for tokens in _inputs(name):
        theirs = assembled.apply(tokens)
        seen = []
        hooks = [layer.register_forward_hook(lambda m, i, o: seen.append(o.detach())) for layer in model.layers]
        with torch.no_grad():
            ours = model(model.encode(tokens))[0].numpy()
        for hook in hooks:
            hook.remove()
        # tracr records the residual after every attention block and every MLP; ours after each layer
        for layer, state in enumerate(seen):
            expected = np.asarray(theirs.residuals[2 * layer + 1])[0]
            assert np.abs(state[0].numpy() - expected).max() < 1e-5, (name, layer)
        read_out = np.asarray(theirs.transformer_output)[0] @ weights.unembed
        assert np.abs(ours - read_out).max() < 1e-5
        if weights.categorical:  # the decoded tokens after BOS
            assert list(np.asarray(theirs.unembedded)[0][1:]) == list(ours.argmax(-1)[1:])
        else:
            assert np.allclose(ours[1:, 0], np.asarray(theirs.decoded[1:], dtype=np.float32), atol=1e-5)


def test_each_program_uses_the_components_tracr_placed(compiled):
    name, _, model, weights = compiled
    used = used_components(weights)
    assert used["heads"].shape == (weights.num_layers, weights.num_heads)
    assert used["heads"].any() and used["units"].any()  # every program here needs attention and an MLP
    # frac_prevs: an MLP computes tokens == "x" (layer 0), one head averages it over the prefix (layer 1)
    if name == "frac_prevs":
        assert used["heads"].tolist() == [[False], [True]] and used["units"].sum(1).tolist() == [1, 0]
    # a used head matters on some input, an unused one on none
    for layer in range(weights.num_layers):
        for head in range(weights.num_heads):
            changed = [_changed_without_head(model, tokens, layer, head) for tokens in _inputs(name, count=8, seed=1)]
            assert any(changed) == bool(used["heads"][layer, head]), (name, layer, head)


def _without_head(model, ids, layer, head):
    r"""The output with one head's output zeroed through the model's own identity module."""
    def zero_head(module, inputs, output):
        output = output.clone()
        output[:, :, head] = 0.0
        return output

    hook = model.layers[layer].attention.heads.register_forward_hook(zero_head)
    try:
        with torch.no_grad():
            return model(ids)
    finally:
        hook.remove()


def _changed_without_head(model, tokens, layer, head):
    ids = model.encode(tokens)
    with torch.no_grad():
        full = model(ids)
    return bool((full - _without_head(model, ids, layer, head)).abs().max() > 1e-4)


def test_hooks_on_heads_and_units_see_their_shapes(compiled):
    name, _, model, weights = compiled
    shapes = {}

    def record(key):
        def hook(module, inputs, output):
            shapes[key] = output.shape  # returns None: the output is left as it is
        return hook

    hooks = [model.layers[0].attention.heads.register_forward_hook(record("heads")),
             model.layers[0].mlp.units.register_forward_hook(record("units"))]
    tokens = next(_inputs(name))
    with torch.no_grad():
        model(model.encode(tokens))
    for hook in hooks:
        hook.remove()
    assert shapes["heads"] == (1, len(tokens), weights.num_heads, weights.key_size)
    assert shapes["units"] == (1, len(tokens), weights.mlp_hidden)


def test_the_librarys_component_sites_find_the_converted_heads_and_units(compiled):
    from captum_diffmask.model.components import gate_components, locate_components

    name, _, model, weights = compiled
    heads, units = locate_components(model, "heads"), locate_components(model, "units")
    assert [site.module for site in heads] == [layer.attention.linear for layer in model.layers]
    assert [(site.count, site.width) for site in heads] == [(weights.num_heads, weights.key_size)] * weights.num_layers
    assert [site.count for site in units] == [weights.mlp_hidden] * weights.num_layers
    # closing a used head through the library's gates is the ablation through the model's own identity module
    used = used_components(weights)["heads"]
    layer, head = [tuple(index) for index in np.argwhere(used)][-1]
    gates = {site.name: torch.ones(1, site.count) for site in heads}
    gates[f"heads.{layer + 1}"][0, head] = 0.0
    for tokens in _inputs(name, count=4, seed=2):
        ids = model.encode(tokens)
        with torch.no_grad(), gate_components(heads, gates):
            gated = model(ids)
        assert torch.allclose(gated, _without_head(model, ids, layer, head), atol=1e-5)
