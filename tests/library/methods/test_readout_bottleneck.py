"""The Readout Bottleneck (Schulz et al. 2020, Sec. 3.2): a network trained once
predicts the bottleneck, attribution is one pass."""

import math

import pytest
import torch

from captum_diffmask import compare
from captum_diffmask.methods import PerSampleBottleneck, ReadoutBottleneck
from captum_diffmask.methods.readout_bottleneck import ALPHA_BOUND, ReadoutNetwork
from captum_diffmask.evaluation.toy_task import toy_ground_truth, toy_sites

from tiny_models import query_minus_other, tiny_bert, tiny_causal_lm, token_batch


def test_the_network_starts_nearly_open_and_is_bounded_as_ibas():
    torch.manual_seed(0)
    network = ReadoutNetwork(features=12, out=4, classes=3)
    alpha = network(torch.randn(2, 5, 12), torch.tensor([0, 2]))
    assert alpha.shape == (2, 5, 4)
    # bias 5 and weights x 1e-3 in the last layer: alpha starts at the bound, sigmoid 0.993
    assert (alpha <= ALPHA_BOUND).all() and (alpha > ALPHA_BOUND - 0.05).all()
    with torch.no_grad():
        network.layers[-1].bias.fill_(-40.0)
    assert torch.equal(network(torch.randn(2, 5, 12), torch.tensor([0, 2])), torch.full((2, 5, 4), -ALPHA_BOUND))
    # the target embedding is part of the input: another class, another alpha
    with torch.no_grad():
        network.layers[-1].bias.fill_(0.0)
        network.layers[-1].weight.mul_(1e3)
    features = torch.randn(1, 5, 12)
    assert not torch.equal(network(features, torch.tensor([0])), network(features, torch.tensor([1])))


def test_toy_query_digits_carry_more_information(toy_setup):
    model, _, train, valid = toy_setup
    data = valid.subset(torch.arange(96))
    truth = toy_ground_truth(data.ids, data.query, data.mask)
    bottleneck = ReadoutBottleneck(model, sites=toy_sites(model), padding_mask_arg=1)
    history = bottleneck.fit(train.loader(128, shuffle=True, seed=0), layers=[1], epochs=10, seed=0, verbose=False)
    assert [row["epoch"] for row in history] == list(range(1, 11)) and history[0]["steps"] == 71
    assert history[-1]["loss"] < 0.2 * history[0]["loss"]  # measured 29.1 -> 2.7
    assert history[-1]["shut"] < 0.05  # measured 0.0: nothing clamped shut
    # measured (10 epochs, seeds 0-2): capacity 0.15-0.26 bits more at the query
    # digits, on 100 % of examples; alpha 0.03-0.06, on 87-99 %
    for readout, least in (("capacity", 0.1), ("alpha", 0.02)):
        scores = bottleneck.attribute(data.ids, additional_forward_args=(data.query, data.mask), layer=1,
                                      readout=readout)
        assert scores.shape == data.ids.shape and torch.isfinite(scores).all() and (scores >= 0).all()
        assert (scores[~data.mask] == 0).all()
        gap = query_minus_other(scores, truth, data.mask)
        assert gap.mean() > least, (readout, gap.mean())
        assert (gap > 0).float().mean() > 0.8, (readout, (gap > 0).float().mean())


def test_a_network_clamped_shut_is_named_collapsed(toy_setup):
    model, _, train, _ = toy_setup
    bottleneck = ReadoutBottleneck(model, sites=toy_sites(model), padding_mask_arg=1)
    # measured: at lr 1e-2 81 % of the elements are shut after one epoch, 100 % after two
    with pytest.warns(UserWarning, match="collapsed"):
        history = bottleneck.fit(train.loader(128, shuffle=True, seed=0), layers=[1], lr=1e-2, epochs=2, verbose=False)
    assert history[-1]["shut"] > 0.99


def test_the_statistics_are_the_per_sample_bottlenecks_and_every_site_is_read():
    model = tiny_bert()
    batches = [token_batch(seed=i) for i in range(3)]
    readout = ReadoutBottleneck(model)
    readout.fit(batches, layers=[2], epochs=1, verbose=False)
    mean, std = PerSampleBottleneck(model).fit_statistics(batches, layer=2)
    assert torch.equal(readout.statistics["hidden.2"][0], mean) and torch.equal(readout.statistics["hidden.2"][1], std)
    assert readout.readout_sites[2] == readout.site_names
    # the first layer reads every site's states, 32 wide each, and the target
    assert readout.networks[2].layers[0].in_features == 32 * len(readout.site_names) + 32
    assert readout.networks[2].layers[-1].out_features == 32  # one alpha per element
    readout.fit(batches, layers=[1], granularity="token", readout_sites=["hidden.1", "hidden.2"], epochs=1, verbose=False)
    assert readout.networks[1].layers[-1].out_features == 1 and readout.readout_sites[1] == ["hidden.1", "hidden.2"]


def test_the_target_is_read_by_the_network_and_refused_where_there_is_none():
    model = tiny_bert()
    ids, mask = token_batch()
    readout = ReadoutBottleneck(model)
    readout.fit([(ids, mask)] * 3, layers=[1], epochs=2, verbose=False)
    by_class = [readout.attribute(ids, target=c, additional_forward_args=(mask,), layer=1) for c in range(3)]
    assert not torch.equal(by_class[0], by_class[1]) and not torch.equal(by_class[1], by_class[2])
    predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    assert torch.equal(readout.attribute(ids, additional_forward_args=(mask,), layer=1),
                       readout.attribute(ids, target=predicted, additional_forward_args=(mask,), layer=1))
    # a language model's per-position distributions: no fixed class set to read
    lm = tiny_causal_lm("gpt2")
    per_position = ReadoutBottleneck(lm, output="all")
    per_position.fit([(ids, mask)] * 2, layers=[1], epochs=1, verbose=False)
    assert per_position.networks[1].target_embedding is None
    scores = per_position.attribute(ids, additional_forward_args=(mask,), layer=1)
    assert scores.shape == ids.shape and (scores[mask == 0] == 0).all()
    with pytest.raises(ValueError, match="target must be None"):
        per_position.attribute(ids, target=1, additional_forward_args=(mask,), layer=1)
    # target="predicted": a classifier's network reads no target and is trained on the prediction
    kept = ReadoutBottleneck(model)
    kept.fit([(ids, mask)] * 3, layers=[1], epochs=1, target="predicted", verbose=False)
    assert kept.networks[1].target_embedding is None
    assert torch.equal(kept._training_target(kept.networks[1], model(input_ids=ids, attention_mask=mask).logits),
                       predicted)
    with pytest.raises(ValueError, match="target must be None"):
        kept.attribute(ids, target=1, additional_forward_args=(mask,), layer=1)


def test_a_seeded_fit_is_repeatable_and_leaves_the_callers_rng_and_model_as_found():
    model = tiny_bert()
    model.train()
    before = {n: p.clone() for n, p in model.state_dict().items()}
    ids, mask = token_batch()
    runs = []
    for _ in range(2):
        readout = ReadoutBottleneck(model)
        state = torch.get_rng_state()
        readout.fit([(ids, mask)] * 3, layers=[2], epochs=2, seed=7, verbose=False)
        assert torch.equal(torch.get_rng_state(), state)
        runs.append(readout.attribute(ids, additional_forward_args=(mask,), layer=2))
    assert torch.equal(runs[0], runs[1])
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


def test_max_steps_caps_the_fit():
    model = tiny_bert()
    history = ReadoutBottleneck(model).fit([token_batch()] * 5, layers=[1], epochs=3, max_steps=7, verbose=False)
    assert [row["steps"] for row in history] == [5, 2]


def test_evaluate_scores_the_objective_on_held_out_data_without_training():
    model = tiny_bert()
    batches = [token_batch(seed=i) for i in range(3)]
    readout = ReadoutBottleneck(model)
    with pytest.raises(ValueError, match="layer"):
        readout.evaluate(batches, layer=1)
    readout.fit(batches[:2], layers=[1], epochs=1, verbose=False)
    weights = {n: p.clone() for n, p in readout.networks[1].state_dict().items()}
    state = torch.get_rng_state()
    held_out = readout.evaluate(batches[2:], layer=1, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(weights[n], p) for n, p in readout.networks[1].state_dict().items())
    assert set(held_out) == {"steps", "loss", "task", "capacity", "shut", "agreement"} and held_out["steps"] == 1
    assert held_out == readout.evaluate(batches[2:], layer=1, seed=3)
    # loss = task + beta * capacity (the capacity reported in bits, weighted in nats)
    nats = held_out["capacity"] * math.log(2.0)
    assert held_out["loss"] == pytest.approx(held_out["task"] + 10.0 / 32 * nats, rel=1e-5)
    assert readout.evaluate(batches[2:], layer=1, beta=0.0, seed=3)["loss"] == pytest.approx(held_out["task"], rel=1e-6)
    with pytest.raises(ValueError, match="no batch"):
        readout.evaluate([], layer=1)
    # agreement: the share of examples whose noisy pass keeps the model's prediction; with every
    # element flowing (lambda = sigmoid(5)) the noise is 0.7 % of a std and every prediction stays
    with torch.no_grad():
        last = readout.networks[1].layers[-1]
        last.weight.zero_()
        last.bias.fill_(5.0)
    assert readout.evaluate(batches[2:], layer=1, seed=3)["agreement"] == 1.0


def test_compare_fits_it_on_the_training_data_by_name():
    model = tiny_bert()
    ids, mask = token_batch()
    result = compare(model, ids, ["ReadoutBottleneck", ("ReadoutBottleneck", {"readout": "alpha", "epochs": 1})],
                     layer=1, additional_forward_args=(mask,), train_data=[(ids, mask)] * 2)
    scores = list(result.scores.values())
    assert len(scores) == 2 and result.methods[list(result.methods)[0]].setup_seconds > 0
    assert all(s.shape == ids.shape for s in scores)
    assert scores[1].max() <= 1.0  # sigmoid(alpha), a share


def test_bad_options_are_named():
    model = tiny_bert()
    ids, mask = token_batch()
    readout = ReadoutBottleneck(model)
    with pytest.raises(ValueError, match="fit"):
        readout.attribute(ids, additional_forward_args=(mask,), layer=1)
    with pytest.raises(ValueError, match="granularity"):
        readout.fit([(ids, mask)], layers=[1], granularity="pixel")
    with pytest.raises(ValueError, match="target"):
        readout.fit([(ids, mask)], layers=[1], target="gold")
    with pytest.raises(ValueError, match="readout_sites"):
        readout.fit([(ids, mask)], layers=[1], readout_sites=["hidden.9"])
    with pytest.raises(ValueError, match="epochs"):
        readout.fit([(ids, mask)], layers=[1], epochs=0)
    with pytest.raises(ValueError, match="layer"):
        readout.fit([(ids, mask)], layers=[5])
    with pytest.raises(ValueError, match="no real tokens"):
        readout.fit([], layers=[1])
    readout.fit([(ids, mask)], layers=[1], epochs=1, verbose=False)
    with pytest.raises(ValueError, match="readout"):
        readout.attribute(ids, additional_forward_args=(mask,), layer=1, readout="bits")
    with pytest.raises(ValueError, match="layer"):
        readout.prepare_on_data([(ids, mask)], None, {})


def test_fit_takes_diffmasks_layers_contract_and_the_old_layer_with_a_warning():
    model = tiny_bert()
    ids, mask = token_batch()
    readout = ReadoutBottleneck(model)
    history = readout.fit([(ids, mask)] * 2, epochs=1, verbose=False)  # every layer, as DiffMask.fit
    assert [row["layer"] for row in history] == [0, 1, 2] and sorted(readout.networks) == [0, 1, 2]
    for k in (0, 1, 2):
        assert readout.attribute(ids, additional_forward_args=(mask,), layer=k).shape == ids.shape
    with pytest.warns(DeprecationWarning, match=r"fit\(layers=\[k\]\)"):
        old = ReadoutBottleneck(model).fit([(ids, mask)], layer=1, epochs=1, verbose=False)
    assert [row["layer"] for row in old] == [1]
    with pytest.raises(ValueError, match="layers must be a non-empty sequence"):
        readout.fit([(ids, mask)], layers=1)
    with pytest.raises(ValueError, match="not both"):
        readout.fit([(ids, mask)], layers=[1], layer=1)
    with pytest.raises(ValueError, match="layer must be in 0..2"):
        readout.fit([(ids, mask)], layers=[5])
