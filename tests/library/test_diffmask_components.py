"""DiffMask over attention heads and MLP units (``mode="heads"``/``"units"``): one
gate per component and input, fitted with the token modes' Lagrangian, read out
per block, saved and loaded; a head that writes nothing is closed, a needed one
kept."""

import copy

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.model.components import gate_components
from captum_diffmask.model.divergences import example_kl, log_probs

from tiny_models import sensitized, tiny_bert, tiny_causal_lm, token_batch


def _one_dead_head_per_block():
    r"""A sensitised tiny BERT whose head 1 writes nothing (its output projection's
    columns are zero) in both blocks: closing it cannot change the output."""
    model = sensitized(tiny_bert())
    with torch.no_grad():
        for block in model.bert.encoder.layer:
            block.attention.output.dense.weight[:, 16:] = 0
    return model


@pytest.mark.parametrize("mode, count", [("heads", 2), ("units", 37)])
def test_shapes_one_gate_per_component_and_input(mode, count):
    model = tiny_bert()
    batches = [token_batch(seed=i) for i in range(2)]
    explainer = DiffMask(model, mode=mode)
    assert [(c.name, c.count) for c in explainer.components] == [(f"{mode}.1", count), (f"{mode}.2", count)]
    explainer.fit(batches, max_steps=4, verbose=False)
    assert explainer.fitted_layers == [1, 2]  # layer k is block k; layer 0 has no components
    ids, mask = batches[0]
    every = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert every.shape == (ids.shape[0], 2, count) and ((every >= 0) & (every <= 1)).all()
    one = explainer.attribute(ids, additional_forward_args=(mask,), layer=2)
    assert torch.equal(one, every[:, 1])
    assert explainer.learned_baseline(1).shape == (count, 16 if mode == "heads" else 1)
    gates, masked, original = explainer.masked_forward(ids, (mask,), layer=1)
    assert gates.shape == (ids.shape[0], count) and masked.shape == original.shape
    with pytest.raises(ValueError, match="layer"):
        explainer.attribute(ids, additional_forward_args=(mask,))  # the default layer 0 has no gates here
    with pytest.raises(ValueError, match="layers"):
        explainer.fit(batches, layers=[0], max_steps=2, verbose=False)


def test_the_gates_pool_real_positions_only():
    model = tiny_bert()
    ids, mask = token_batch(seed=0)
    explainer = DiffMask(model, mode="heads")
    explainer.fit([(ids, mask)] * 2, max_steps=6, verbose=False)
    with torch.no_grad():  # a trained-looking probe: gates that depend on the input
        for net in explainer.probe.nets:
            net.last.weight.normal_(0, 1.0)
    before = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    # the same inputs with four more padded positions, holding other tokens
    longer = torch.cat([ids, torch.randint(5, 50, (ids.shape[0], 4))], 1)
    padded = torch.cat([mask, torch.zeros(mask.shape[0], 4, dtype=mask.dtype)], 1)
    after = explainer.attribute(longer, additional_forward_args=(padded,), layer=None)
    assert torch.allclose(before, after, atol=1e-5)
    assert (before[0] - before[1]).abs().max() > 1e-3  # and they do depend on the input


def test_the_baselines_start_at_the_mean_component_and_a_closed_gate_puts_it_in():
    model = sensitized(tiny_causal_lm("gpt2"))
    ids, mask = token_batch(seed=1)
    explainer = DiffMask(model, mode="units")
    explainer.fit([(ids, mask)], max_steps=1, lr=1e-12, optimization={"lr_baseline": 0.0}, verbose=False)
    site = explainer.components[0]
    seen = {}
    hook = site.module.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].detach()))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    finally:
        hook.remove()
    real = mask.bool()
    assert torch.allclose(explainer.learned_baseline(1)[:, 0], seen["x"][real].mean(0), atol=1e-5)


def _closing_cost(model, sites, ids, mask, head):
    r"""Per input, (len(sites), B): the KL of the output when ``head`` alone is
    closed (zero ablation) in one block."""
    with torch.no_grad():
        original = log_probs(model(input_ids=ids, attention_mask=mask).logits)
        costs = []
        for site in sites:
            gates = torch.ones(ids.shape[0], 2)
            gates[:, head] = 0
            with gate_components([site], {site.name: gates}):
                costs.append(example_kl(original, log_probs(model(input_ids=ids, attention_mask=mask).logits)))
    return torch.stack(costs)


def _inputs_that_need_head_0(model, sites, least, batch=4, candidates=64):
    r"""Batches of ``batch`` inputs, drawn from ``candidates`` token batches, on
    which closing head 0 costs a KL of at least ``least`` in every block: where
    it costs less, the constrained optimum closes it on some inputs and not on
    others, and which ones is a matter of the optimiser's path."""
    drawn = [token_batch(seed=i) for i in range(candidates)]
    ids, mask = torch.cat([i for i, _ in drawn]), torch.cat([m for _, m in drawn])
    needed = _closing_cost(model, sites, ids, mask, head=0).min(0).values >= least
    ids, mask = ids[needed], mask[needed]
    return [(ids[i:i + batch], mask[i:i + batch]) for i in range(0, len(ids) - batch + 1, batch)]


def test_a_head_that_writes_nothing_is_closed_and_a_needed_one_kept():
    model = _one_dead_head_per_block()
    explainer = DiffMask(model, mode="heads")
    batches = _inputs_that_need_head_0(model, explainer.components, least=0.25)
    assert len(batches) >= 6  # measured: 33 of the 256 inputs, 8 batches
    ids = torch.cat([i for i, _ in batches])
    mask = torch.cat([m for _, m in batches])
    assert _closing_cost(model, explainer.components, ids, mask, head=1).max() <= 1e-6
    zeros = {k: torch.zeros(2, 16) for k in (1, 2)}  # zero ablation, kept fixed: a head cannot hide in the baseline
    # With the expected L0 (the sum over the two heads), closing head 0 on one of a batch's 4 inputs lowers
    # the L0 term by 1/4 and raises the batch's KL by at least 0.25/4, so at a multiplier of at least 5 it
    # never pays: the optimum is unique. At fit's default floor (0.01) the multiplier decays while head 0
    # is open and the constraint slack, the L0 term then closes head 0 until the KL returns, and the fit
    # cycles; whether a cap finds it settled depended on the CPU's floating-point path (measured: converged
    # on an Intel Xeon, unsettled or violated on an AMD EPYC).
    explainer.fit(batches, eps=0.05,
                  optimization={"init_baseline": zeros, "lr_baseline": 0.0, "controller": {"floor": 5.0}}, seed=0,
                  verbose=False)
    assert {k: v["status"] for k, v in explainer.convergence.items()} == {1: "converged", 2: "converged"}
    keep = torch.cat([explainer.attribute(i, additional_forward_args=(m,), layer=None) for i, m in batches])
    # measured (seven fits, seeds 0-3 on three CPU code paths): head 1 kept with mean P 0.005-0.02, head 0 >= 0.99
    assert (keep[..., 1].mean(0) < 0.05).all() and (keep[..., 0].mean(0) > 0.9).all()
    assert (keep[..., 0] > keep[..., 1]).float().mean() >= 0.9
    assert all(row["kl"] <= 0.05 for row in explainer.evaluate(batches).values())


def test_save_and_load_give_the_same_gates(tmp_path):
    model = tiny_causal_lm("llama")
    ids, mask = token_batch(seed=2)
    explainer = DiffMask(model, mode="heads")
    explainer.fit([(ids, mask)] * 2, max_steps=5, verbose=False)
    path = tmp_path / "heads.pt"
    explainer.save(path)
    loaded = DiffMask.load(path, model)
    assert loaded.mode == "heads" and loaded.fitted_layers == [1, 2]
    assert torch.equal(loaded.attribute(ids, additional_forward_args=(mask,), layer=None),
                       explainer.attribute(ids, additional_forward_args=(mask,), layer=None))
    with pytest.raises(ValueError, match="mode"):
        DiffMask(model, mode="neurons")


def test_the_per_task_mask_is_one_mask_for_every_input_and_finds_the_dead_heads(tmp_path):
    model = _one_dead_head_per_block()
    batches = [token_batch(seed=i) for i in range(8)]
    explainer = DiffMask(model, mode="heads", per_task=True)
    zeros = {k: torch.zeros(2, 16) for k in (1, 2)}
    # Adam moves a bias by about lr a step: at fit's lr (3e-3) a gate that starts at 5 needs over 2 000
    # steps to close, hence a larger lr for the biases alone
    explainer.fit(batches, eps=0.05, lr=0.03, optimization={"init_baseline": zeros, "lr_baseline": 0.0},
                  max_steps=800, seed=0, verbose=False)
    keep = torch.cat([explainer.attribute(i, additional_forward_args=(m,), layer=None) for i, m in batches])
    assert torch.equal(keep, keep[:1].expand_as(keep))  # no input changes the mask
    # head 0 is needed on most inputs (zero ablation: KL 0.25 and 0.18), so one mask keeps it everywhere
    assert keep[0, :, 1].max() < 0.05 and keep[0, :, 0].min() > 0.5
    assert [name for name, _ in explainer.probe.named_parameters() if "nets" in name] == ["nets.0.bias", "nets.1.bias"]
    explainer.save(tmp_path / "task.pt")
    loaded = DiffMask.load(tmp_path / "task.pt", model)
    assert loaded.per_task and torch.equal(loaded.attribute(*batches[0][:1], additional_forward_args=batches[0][1:],
                                                            layer=None), keep[:batches[0][0].shape[0]])
    with pytest.raises(ValueError, match="per_task"):
        DiffMask(model, mode="input", per_task=True)


def test_components_named_by_hand_gate_a_model_the_rule_cannot_read(tmp_path):
    model = tiny_bert()
    batches = [token_batch(seed=i) for i in range(2)]
    ids, mask = batches[0]
    located = DiffMask(model, mode="heads")
    located.fit(batches, max_steps=4, seed=0, verbose=False)
    expected = located.attribute(ids, additional_forward_args=(mask,), layer=None)
    # the same model, its attention modules renamed: the locating rule no longer finds them
    renamed = copy.deepcopy(model)
    for module in renamed.modules():
        if "attention" in type(module).__name__.lower():
            module.__class__ = type("Mixer", (type(module),), {})
    with pytest.raises(ValueError, match="no attention module"):
        DiffMask(renamed, mode="heads")
    heads = {k + 1: (block.attention.output.dense, 2) for k, block in enumerate(renamed.bert.encoder.layer)}
    named = DiffMask(renamed, mode="heads", components=heads)
    named.fit(batches, max_steps=4, seed=0, verbose=False)
    assert torch.allclose(named.attribute(ids, additional_forward_args=(mask,), layer=None), expected, atol=1e-6)
    named.save(tmp_path / "named.pt")
    loaded = DiffMask.load(tmp_path / "named.pt", renamed, components=heads)
    assert torch.equal(loaded.attribute(ids, additional_forward_args=(mask,), layer=None),
                       named.attribute(ids, additional_forward_args=(mask,), layer=None))
    with pytest.raises(ValueError, match="components: only the modes"):
        DiffMask(model, mode="input", components=heads)


def test_the_joint_mask_is_one_layer_that_gates_every_block_at_once(tmp_path):
    model = tiny_causal_lm("gpt2")
    batches = [token_batch(seed=i) for i in range(2)]
    ids, mask = batches[0]
    explainer = DiffMask(model, mode="heads", joint=True)
    assert explainer.gated_layers == [0]
    explainer.fit(batches, max_steps=6, lr=0.05, seed=0, verbose=False)
    assert explainer.fitted_layers == [0] and list(explainer.convergence) == [0]
    every = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert every.shape == (ids.shape[0], 2, 2)
    assert torch.equal(explainer.attribute(ids, additional_forward_args=(mask,), layer=2), every[:, 1])
    assert torch.equal(explainer.attribute(ids, additional_forward_args=(mask,), layer=0), every.flatten(1))
    # layer 0's masked pass is the model with both blocks' deterministic gates at once
    gates, masked, original = explainer.masked_forward(ids, (mask,), layer=0)
    assert gates.shape == (ids.shape[0], 4)
    closed = torch.ones(ids.shape[0], 4)
    closed[:, 1] = closed[:, 2] = 0  # block 1's head 1 and block 2's head 0
    with torch.no_grad():
        replaced, context = explainer.gates.replacement({"hidden.0": None}, closed, 0)
        sites = explainer.components
        baselines = {s.name: explainer.learned_baseline(s.layer) for s in sites}
        with gate_components(sites, {"heads.1": closed[:, :2], "heads.2": closed[:, 2:]}, baselines):
            by_hand = model(input_ids=ids, attention_mask=mask).logits
        with context:
            via_gates = model(input_ids=ids, attention_mask=mask).logits
        plain = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(via_gates, by_hand) and list(replaced) == ["hidden.0"]
    assert not torch.allclose(via_gates, plain, atol=1e-4)  # the closed heads did change the output
    assert list(explainer.evaluate(batches)) == [0]
    explainer.save(tmp_path / "joint.pt")
    loaded = DiffMask.load(tmp_path / "joint.pt", model)
    assert loaded.joint and torch.equal(loaded.attribute(ids, additional_forward_args=(mask,), layer=None), every)
    with pytest.raises(ValueError, match="layers: 1 has no gates here"):
        explainer.fit(batches, layers=[1], max_steps=2, verbose=False)
    with pytest.raises(ValueError, match="init_baseline: layer 0"):
        explainer.fit(batches, optimization={"init_baseline": {0: torch.zeros(4, 16)}}, max_steps=2, verbose=False)
    with pytest.raises(ValueError, match="joint: one mask over every block"):
        DiffMask(model, mode="hidden", joint=True)
