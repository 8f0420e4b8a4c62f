#!/usr/bin/env python3
"""Tests of the toy task: data generator, model, ground truth and training."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from captum_diffmask.evaluation.toy_task import (
    ToyData, ToyModel, accuracy, generate_toy_data, toy_ground_truth, toy_sites, train_toy_model,
)


@pytest.fixture(scope="module")
def data() -> ToyData:
    return generate_toy_data(10_000, seed=0)


def test_shapes_and_dtypes(data: ToyData) -> None:
    assert len(data) == 10_000
    assert data.ids.shape == (10_000, 10) and data.ids.dtype == torch.long
    assert data.query.shape == (10_000, 2) and data.query.dtype == torch.long
    assert data.mask.shape == (10_000, 10) and data.mask.dtype == torch.bool
    assert data.labels.shape == (10_000,) and data.labels.dtype == torch.float32
    assert set(data.labels.unique().tolist()) == {0.0, 1.0}
    assert int(data.ids.min()) >= 0 and int(data.ids.max()) == 9
    assert (data.query[:, 0] != data.query[:, 1]).all()


def test_seed_determines_data() -> None:
    a = generate_toy_data(300, seed=3)
    b = generate_toy_data(300, seed=3)
    c = generate_toy_data(300, seed=4)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.query, b.query)
    assert not torch.equal(a.ids, c.ids)


def test_labels_match_brute_force_count(data: ToyData) -> None:
    for i in range(200):
        n, m = data.query[i].tolist()
        length = int(data.mask[i].sum())
        real = data.ids[i, :length].tolist()
        counts = Counter(real)
        assert data.labels[i].item() == float(counts[n] > counts[m])


def test_element_distribution(data: ToyData) -> None:
    gt = toy_ground_truth(data.ids, data.query, data.mask)
    share = gt.sum().item() / data.mask.sum().item()
    assert abs(share - 0.5) < 0.03
    # n and m are equally likely, so about a quarter of the positions each.
    real = data.mask
    share_n = ((data.ids == data.query[:, :1]) & real).sum().item() / real.sum().item()
    assert abs(share_n - 0.25) < 0.02
    # Queries cover all 90 ordered pairs of distinct digits.
    pairs = {tuple(q) for q in data.query.tolist()}
    assert len(pairs) == 90
    # With label = #n > #m and ties counted as 0, the positive class is the
    # minority (~36% for the paper's settings, as P(#n > #m) < 1/2).
    assert 0.3 < data.labels.mean().item() < 0.42


def test_lengths_and_padding(data: ToyData) -> None:
    lengths = data.mask.sum(1)
    assert set(lengths.tolist()) == set(range(1, 11))
    # Real positions form a prefix of each row.
    prefix = torch.arange(10).unsqueeze(0) < lengths.unsqueeze(1)
    assert torch.equal(prefix, data.mask)
    assert (data.ids[~data.mask] == 0).all()


def test_vocab_size_and_max_length_are_parameters() -> None:
    d = generate_toy_data(2_000, vocab_size=6, max_length=7, seed=1)
    assert d.ids.shape == (2_000, 7)
    assert int(d.ids.max()) == 5 and int(d.query.max()) == 5
    assert set(d.mask.sum(1).tolist()) == set(range(1, 8))
    # The smallest vocabulary: one digit outside the query.
    d3 = generate_toy_data(500, vocab_size=3, max_length=4, seed=2)
    others = 3 - d3.query.sum(1, keepdim=True)  # the third digit of {0, 1, 2}
    assert ((d3.ids == others) & d3.mask).any()
    assert ((d3.ids[d3.mask] >= 0) & (d3.ids[d3.mask] <= 2)).all()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(vocab_size=2), "vocab_size"),
        (dict(max_length=0), "max_length"),
        (dict(num_examples=0), "num_examples"),
    ],
)
def test_bad_arguments(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        generate_toy_data(**kwargs)


def _fingerprints(d: ToyData) -> Counter:
    rows = torch.cat([d.ids, d.query, d.mask.long(), d.labels.long()[:, None]], 1)
    return Counter(map(tuple, rows.tolist()))


def test_split_subset_and_batches(data: ToyData) -> None:
    train, holdout = data.split(0.1, seed=0)
    assert (len(train), len(holdout)) == (9_000, 1_000)
    # The two parts together hold the same multiset of examples as the whole.
    assert _fingerprints(train) + _fingerprints(holdout) == _fingerprints(data)
    again, _ = data.split(0.1, seed=0)
    assert torch.equal(again.ids, train.ids)
    with pytest.raises(ValueError, match="holdout_fraction"):
        data.split(1.0, seed=0)

    small = data.subset(torch.arange(5))
    assert torch.equal(small.ids, data.ids[:5]) and len(small) == 5

    batches = list(small.batches(2))
    assert [b[0].shape[0] for b in batches] == [2, 2, 1]
    assert all(isinstance(b, tuple) and len(b) == 3 for b in batches)
    assert torch.equal(torch.cat([b[2] for b in batches]), small.mask)
    shuffled = torch.cat([b[0] for b in small.batches(2, shuffle=True, seed=1)])
    assert sorted(shuffled.tolist()) == sorted(small.ids.tolist())

    loaded = list(small.loader(2, shuffle=False))
    assert isinstance(loaded[0], list) and len(loaded[0]) == 3
    assert torch.equal(torch.cat([b[1] for b in loaded]), small.query)


def test_model_forward_shape_and_sites() -> None:
    model = ToyModel()
    d = generate_toy_data(7, seed=0)
    assert model(d.ids, d.query, d.mask).shape == (7,)
    assert model(d.ids, d.query).shape == (7,)
    sites = toy_sites(model)
    assert sites["input"] is model.embed_input
    assert sites["hidden"] == [model.embed_input, model.encoder]


def test_model_ignores_padding() -> None:
    torch.manual_seed(0)
    model = ToyModel().eval()
    d = generate_toy_data(64, seed=5)
    assert (~d.mask).any()
    noisy = d.ids.clone()
    noisy[~d.mask] = torch.randint(0, 10, (int((~d.mask).sum()),))
    assert not torch.equal(noisy, d.ids)
    with torch.no_grad():
        torch.testing.assert_close(
            model(noisy, d.query, d.mask), model(d.ids, d.query, d.mask)
        )
        # Without a mask the pads are read, so the logits do change.
        assert not torch.allclose(model(noisy, d.query), model(d.ids, d.query))
        # Truncating to the real prefix gives the same logit (one example).
        length = int(d.mask[0].sum())
        torch.testing.assert_close(
            model(d.ids[:1, :length], d.query[:1]),
            model(d.ids[:1], d.query[:1], d.mask[:1]),
        )


def test_hooks_can_replace_sites() -> None:
    # The library masks the outputs of embed_input and encoder with forward
    # hooks; replacing the encoder output by zeros must make every logit equal.
    torch.manual_seed(0)
    model = ToyModel().eval()
    d = generate_toy_data(16, seed=0)
    handle = model.encoder.register_forward_hook(
        lambda mod, inp, out: torch.zeros_like(out)
    )
    try:
        with torch.no_grad():
            logits = model(d.ids, d.query, torch.ones_like(d.mask))
    finally:
        handle.remove()
    torch.testing.assert_close(logits, logits[:1].expand(16))


def test_ground_truth_by_hand() -> None:
    ids = torch.tensor([[3, 1, 4, 1, 5, 0], [2, 7, 2, 7, 0, 0]])
    query = torch.tensor([[1, 5], [0, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    expected = torch.tensor(
        [[0.0, 1.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]]
    )
    # Row 2 queries digit 0, which is also the pad id: pads must stay 0.
    assert torch.equal(toy_ground_truth(ids, query, mask), expected)


def test_train_reaches_paper_accuracy(data: ToyData) -> None:
    train, valid = data.split(0.1, seed=0)
    # Tiny ops gain nothing from a second thread, and two threads slow down
    # badly when another process shares the 2 cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rng_state = torch.get_rng_state()
    try:
        start = time.perf_counter()
        model, acc = train_toy_model(train, valid, seed=0)
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    print(f"toy model: held-out accuracy {acc:.4f} in {elapsed:.1f} s")
    assert acc >= 0.99
    assert not model.training
    assert accuracy(model, valid) == pytest.approx(acc)
    # Training is seeded without touching the global RNG.
    assert torch.equal(torch.get_rng_state(), rng_state)
