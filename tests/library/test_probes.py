"""The gate networks: several evaluated together, each as if alone."""

import math

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from captum_diffmask import DiffMask
from captum_diffmask.diffmask.gate_networks import GateNetworks
from captum_diffmask.diffmask.probes import HiddenGateProbe, InputGateProbe
from captum_diffmask.evaluation.toy_task import ToyModel, toy_sites

EQUAL, UNEQUAL = [12, 12, 12], [66, 2, 12]  # unequal: the toy task's [input; state], state alone
# A logit is 10 * tanh(.) + b, terms of size up to 10 and 5, where float32 numbers are
# 1e-6 and 5e-7 apart. Networks of one input size evaluated together or alone run the
# same products (seen: bit-equal); zero padding or another implementation sums in
# another order, a few of those steps off (seen: up to 4.3e-6 over 300 draws).
SAME = dict(atol=1e-6, rtol=0)
LOGITS = dict(atol=1e-5, rtol=0)


def _networks(sizes, hidden=8, seed=0):
    r"""Networks with a last layer that matters (at init every logit is ~5) and
    standardisation from shifted, scaled features."""
    torch.manual_seed(seed)
    networks = GateNetworks(sizes, hidden)
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    for j, size in enumerate(sizes):
        networks.standardize(j, torch.randn(3, 5, size) * (j + 2) + j, mask)
    with torch.no_grad():
        for net in networks.nets:
            net.gain2.fill_(2.0)
            net.bias2.fill_(0.3)
    return networks


def _features(sizes, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 5, size, generator=generator) * 3 + 1 for size in sizes]


def _reference(networks, j, features):
    r"""Network j as a plain nn.Module: torch's weight_norm (dim=0) on nn.Linear, the
    maths of the gate network before the networks were stacked."""
    net = networks.nets[j]
    first = weight_norm(nn.Linear(networks.in_sizes[j], networks.hidden_features))
    last = weight_norm(nn.Linear(networks.hidden_features, 1))
    with torch.no_grad():
        first.parametrizations.weight.original0.copy_(net.gain1.unsqueeze(1))
        first.parametrizations.weight.original1.copy_(net.direction1)
        first.bias.copy_(net.bias1)
        last.parametrizations.weight.original0.fill_(float(net.gain2))
        last.parametrizations.weight.original1.copy_(net.direction2.unsqueeze(0))
        last.bias.fill_(float(net.bias2))
    size = networks.in_sizes[j]
    x = (features - networks.feature_mean[j, :size]) / networks.feature_std[j, :size]
    out = last(torch.tanh(first(x))).squeeze(-1)
    return networks.max_activation * torch.tanh(out) + net.bias


@pytest.mark.parametrize("sizes", [EQUAL, UNEQUAL], ids=["equal", "unequal"])
def test_stacked_evaluation_equals_each_network_alone(sizes):
    networks = _networks(sizes)
    features = _features(sizes)
    with torch.no_grad():
        together = networks(features)
        assert together.shape == (3, 5, len(sizes)) and together.dtype == torch.float32
        assert together.std() > 0.5  # the networks' outputs are not all ~ the bias
        for j, feature in enumerate(features):
            alone = networks([feature], [j])[..., 0]
            torch.testing.assert_close(together[..., j], alone, **(SAME if sizes == EQUAL else LOGITS))
            torch.testing.assert_close(together[..., j], _reference(networks, j, feature), **LOGITS)
        # any subset, in any order
        subset = networks([features[2], features[0]], [2, 0])
        torch.testing.assert_close(subset, together[..., [2, 0]], **LOGITS)


def test_gradients_reach_only_the_evaluated_networks():
    networks = _networks(UNEQUAL)
    features = _features(UNEQUAL)
    optimiser = torch.optim.Adam(networks.parameters(), lr=0.1)
    before = {name: p.detach().clone() for name, p in networks.named_parameters()}
    networks([features[2], features[0]], [2, 0]).sum().backward()
    for name, p in networks.named_parameters():
        if name.startswith("nets.1."):
            assert p.grad is None, name  # not a zero gradient: the optimiser skips it
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    optimiser.step()
    moved = {name for name, p in networks.named_parameters() if not torch.equal(p, before[name])}
    assert moved and not any(name.startswith("nets.1.") for name in moved)
    assert all(p not in optimiser.state for p in networks.nets[1].parameters())


def test_padding_changes_neither_the_gradients_nor_an_optimiser_step():
    # The 2-d network evaluated beside the 66-d one is zero-padded to 66 inputs; its
    # gradients and its RMSprop step must be those it gets evaluated alone.
    stacked, alone = _networks(UNEQUAL), _networks(UNEQUAL)
    features = _features(UNEQUAL)
    for networks, call in ((stacked, lambda n: n(features[:2])[..., 1]),
                           (alone, lambda n: n([features[1]], [1])[..., 0])):
        optimiser = torch.optim.RMSprop(networks.nets[1].parameters(), lr=1e-2, centered=True)
        call(networks).pow(2).sum().backward()
        optimiser.step()
    for (name, p), q in zip(stacked.nets[1].named_parameters(), alone.nets[1].parameters()):
        # equal up to float32 rounding (the padded product sums in another order)
        scale = float(q.grad.abs().max())
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6 * scale, rtol=1e-5, msg=name)
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)
    assert stacked.nets[1].direction1.shape == (8, 2)  # the padding is not a parameter


def test_every_gate_starts_at_the_bias():
    torch.manual_seed(0)
    hidden = 96
    networks = GateNetworks([768, 384, 2], hidden)
    mask = torch.ones(32, 30)
    features = [torch.randn(32, 30, size) * 4 + 2 for size in networks.in_sizes]
    for j, feature in enumerate(features):
        networks.standardize(j, feature, mask)
    with torch.no_grad():
        deviation = (networks(features) - 5.0).abs()
    # |xi * tanh(g * v.h / |v|)| <= xi * g * |h| <= 10 * 1e-3 * sqrt(hidden): ~0.1 at
    # worst, far less in practice; P(z != 0) stays ~0.995 for every gate.
    assert deviation.max() <= 10 * 1e-3 * math.sqrt(hidden)
    assert deviation.mean() < 1e-2
    for net in networks.nets:
        assert net.bias.item() == 5.0 and net.gain2.item() == pytest.approx(1e-3)


def test_standardisation_is_per_network():
    torch.manual_seed(0)
    networks = GateNetworks(UNEQUAL, 8)
    mask = torch.ones(4, 6)
    mask[1, 2:] = 0  # padded tokens must not count
    features = [torch.randn(4, 6, size) * (3 * j + 1) + 5 * j for j, size in enumerate(UNEQUAL)]
    features[1][mask == 0] = 1e6
    for j in (1, 0):
        networks.standardize(j, features[j], mask)
    assert torch.equal(networks.feature_mean[2], torch.zeros(66)) and torch.equal(networks.feature_std[2], torch.ones(66))
    for j, size in enumerate(UNEQUAL[:2]):
        real = features[j][mask.bool()]
        torch.testing.assert_close(networks.feature_mean[j, :size], real.mean(0))
        torch.testing.assert_close(networks.feature_std[j, :size], real.std(0, unbiased=False))
        assert (networks.feature_mean[j, size:] == 0).all() and (networks.feature_std[j, size:] == 1).all()
    # standardised, a network no longer sees the scale and shift of its features
    rescaled = [f * 7.0 - 3.0 for f in features[:2]]
    before = networks(features[:2]).detach()
    for j in (0, 1):
        networks.standardize(j, rescaled[j], mask)
    after = networks(rescaled).detach()
    torch.testing.assert_close(after[mask.bool()], before[mask.bool()], atol=1e-4, rtol=0)


@pytest.mark.parametrize("read_input", [True, False])
def test_input_probe_votes_are_the_networks_evaluated_together(read_input):
    torch.manual_seed(0)
    probe = InputGateProbe(64, [64, 2, 2], 16, read_input=read_input)
    states = {"input": torch.randn(3, 5, 64), **{f"hidden.{j}": torch.randn(3, 5, s) for j, s in enumerate([64, 2, 2])}}
    probe.init_baselines(states, torch.ones(3, 5))
    hidden = [states[f"hidden.{j}"] for j in range(3)]
    votes = probe(states["input"], hidden[:2])  # layer k = 1: votes 0..1
    assert votes.shape == (3, 5, 2)
    for j in range(2):
        feature = torch.cat([states["input"], hidden[j]], -1) if read_input else hidden[j]
        torch.testing.assert_close(votes[..., j], probe.votes([feature], [j])[..., 0], **LOGITS)


def test_per_depth_votes_are_each_depths_own_and_every_depth_agrees_with_one_depth():
    torch.manual_seed(0)
    sizes = [64, 2, 2]
    probe = InputGateProbe(64, sizes, 16, votes="per_depth")
    assert len(probe.votes) == 6 and len(probe.baselines) == 3  # 1 + 2 + 3 votes, a baseline per depth
    states = {"input": torch.randn(3, 5, 64), **{f"hidden.{j}": torch.randn(3, 5, s) for j, s in enumerate(sizes)}}
    probe.init_baselines(states, torch.ones(3, 5))
    hidden = [states[f"hidden.{j}"] for j in range(3)]
    every = probe.every_depth(states["input"], hidden)
    for k in range(3):
        one = probe(states["input"], hidden[: k + 1])
        assert one.shape == every[k].shape == (3, 5, k + 1)
        torch.testing.assert_close(every[k], one, **LOGITS)
    # depth 2's votes and baseline train alone: depth 0 and 1 receive no gradient
    probe(states["input"], hidden).sum().backward()
    trained = [j for j, net in enumerate(probe.votes.nets) if net.bias.grad is not None]
    assert trained == [3, 4, 5]
    assert probe.baseline(2) is probe.baselines[2] and probe.baseline(0) is not probe.baseline(2)
    shared = InputGateProbe(64, sizes, 16, votes="tied")
    assert len(shared.votes) == 3 and shared.baseline(0) is shared.baseline(2)
    with pytest.raises(ValueError, match="votes must be one of"):
        InputGateProbe(64, sizes, 16, votes="each")


def test_hidden_probe_one_layer_and_several_layers_agree():
    torch.manual_seed(0)
    probe = HiddenGateProbe([64, 2, 2], 16)
    states = [torch.randn(3, 5, s) for s in (64, 2, 2)]
    with torch.no_grad():
        every = probe.layers(states, range(3))
        assert every.shape == (3, 5, 3)
        for k in range(3):
            one = probe(states[k], k)
            assert one.shape == (3, 5)
            torch.testing.assert_close(every[..., k], one, **LOGITS)


def test_bad_features_are_named():
    networks = GateNetworks(UNEQUAL, 8)
    with pytest.raises(ValueError, match="network 1 reads"):
        networks([torch.zeros(2, 3, 66), torch.zeros(2, 3, 3)])
    with pytest.raises(ValueError, match="one entry per network"):
        networks([torch.zeros(2, 3, 66)], [0, 1])


@pytest.mark.parametrize("mode, votes", [("input", "per_depth"), ("input", "tied"), ("hidden", "per_depth")])
def test_save_load_round_trip_with_unequal_site_sizes(tmp_path, mode, votes):
    # The toy model: a 64-d input, a 64-d hidden.0 and a 2-d hidden.1 share one stack.
    torch.manual_seed(0)
    model = ToyModel().eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (8, 7), generator=generator)
    query = torch.randint(0, 10, (8, 2), generator=generator)
    mask = torch.ones(8, 7, dtype=torch.long)
    mask[0, 5:] = 0
    dm = DiffMask(model, mode=mode, sites=toy_sites(model), padding_mask_arg=1, votes=votes)
    dm.fit([(ids, query, mask)] * 3, epochs=2, lr=1e-2, seed=0, verbose=False)
    expected = dm.attribute(ids, additional_forward_args=(query, mask), layer=None)
    assert expected.shape == (8, 7, 2)
    path = tmp_path / "dm.pt"
    dm.save(path)
    loaded = DiffMask.load(path, model, sites=toy_sites(model), padding_mask_arg=1)
    assert torch.equal(loaded.attribute(ids, additional_forward_args=(query, mask), layer=None), expected)
    for k in range(2):
        one = dm.attribute(ids, additional_forward_args=(query, mask), layer=k)
        assert torch.equal(loaded.attribute(ids, additional_forward_args=(query, mask), layer=k), one)
        # one layer's networks alone, or all layers' together: the same up to rounding
        torch.testing.assert_close(one, expected[..., k], atol=1e-6, rtol=0)


def test_features_are_left_alone_and_receive_their_gradients():
    # The standardisation runs in place on the stacked buffer: never on the caller's
    # states, and the gradient still reaches features that require one.
    networks = _networks(UNEQUAL)
    for chosen in ([1], [0, 1, 2]):
        features = [f.requires_grad_() for f in _features(UNEQUAL)]
        copies = [f.detach().clone() for f in features]
        inputs = [features[j] for j in chosen]
        networks(inputs, chosen).sum().backward()
        assert all(torch.equal(f, c) for f, c in zip(features, copies))
        for j in chosen:
            reference = copies[j].clone().requires_grad_()
            _reference(networks, j, reference).sum().backward()
            torch.testing.assert_close(features[j].grad, reference.grad, atol=1e-5, rtol=1e-4)
    # parts read side by side are the concatenation, without it
    a, b = torch.randn(3, 5, 60), torch.randn(3, 5, 6)
    with torch.no_grad():
        torch.testing.assert_close(networks([(a, b)], [0]), networks([torch.cat([a, b], -1)], [0]), atol=0, rtol=0)


def test_networks_reading_the_same_features_are_evaluated_on_one_copy():
    # The votes of every depth that read one hidden.j: one standardised copy of the
    # features, one product; a network with the same tensor but a standardisation
    # of its own is evaluated apart. Values and gradients as each network alone.
    torch.manual_seed(0)
    networks = GateNetworks([12, 12, 12, 12], 8)
    mask = torch.ones(3, 5)
    shared = torch.randn(3, 5, 12) * 3 + 2
    networks.standardize([0, 1, 2], shared, mask)
    networks.standardize(3, shared * 2, mask)
    with torch.no_grad():
        for net in networks.nets:
            net.gain2.fill_(2.0)
            net.bias2.normal_()
    feature = _features([12])[0]
    order = [2, 0, 3, 1]
    assert networks._shared_feature_groups([feature] * 4, order) == [[0, 1, 3], [2]]
    together = networks([feature] * 4, order)
    assert together.shape == (3, 5, 4) and together.std() > 0.5
    for position, j in enumerate(order):
        torch.testing.assert_close(together[..., position], _reference(networks, j, feature), **LOGITS)
    together.pow(2).sum().backward()
    grouped = [net.direction1.grad.clone() for net in networks.nets]
    networks.zero_grad()
    sum(networks([feature], [j]).pow(2).sum() for j in order).backward()
    for j, net in enumerate(networks.nets):
        torch.testing.assert_close(grouped[j], net.direction1.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode, votes", [("input", "per_depth"), ("input", "tied"), ("hidden", "per_depth")])
def test_the_logits_of_several_layers_in_one_call_are_each_layers_own(mode, votes):
    # what a fit step samples from: one probe call for the layers it trains
    from captum_diffmask.diffmask.gates import Gates

    torch.manual_seed(0)
    sizes = [64, 2, 2, 2]
    if mode == "input":
        probe = InputGateProbe(64, sizes, 16, votes=votes)
    else:
        probe = HiddenGateProbe(sizes, 16)
    states = {"input": torch.randn(3, 5, 64), **{f"hidden.{j}": torch.randn(3, 5, s) for j, s in enumerate(sizes)}}
    probe.init_baselines(states, torch.ones(3, 5))
    networks = probe.votes if mode == "input" else probe.gates
    with torch.no_grad():
        for net in networks.nets:
            net.gain2.fill_(2.0)
    gates = Gates(probe, mode, 2 / 3, (-0.2, 1.0))
    layers = [3, 1, 2]
    together = gates.logits_of_layers(states, layers)
    assert list(together) == layers
    for k in layers:
        alone = gates.logits(states, k)
        assert together[k].shape == alone.shape and alone.std() > 0.1
        torch.testing.assert_close(together[k], alone, **LOGITS)


def test_without_gradients_the_stacked_weights_are_kept_until_a_parameter_changes():
    networks = GateNetworks([12, 12, 12], 8)
    x = torch.randn(5, 12)
    with torch.no_grad():
        first = networks([x, x, x])  # one group: the shared-features path
        assert len(networks._held_weights) == 1
        again = networks([x, x, x])
        assert torch.equal(first, again)
        networks.nets[1].gain1.mul_(2.0)  # an in-place update: held weights are stale
        changed = networks([x, x, x])
    fresh = networks([x, x, x])  # with gradients: computed anew, nothing kept
    assert torch.equal(changed, fresh.detach()) and not torch.equal(changed[:, 1], first[:, 1])
    assert torch.equal(changed[:, 0], first[:, 0])
