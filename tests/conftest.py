"""Shared fixtures: a tiny BERT, a token batch and the trained toy model (helpers in
``tiny_models``)."""

import pytest

from tiny_models import tiny_bert, token_batch


@pytest.fixture
def bert():
    return tiny_bert()


@pytest.fixture
def batch():
    return token_batch()


@pytest.fixture(scope="session")
def toy_setup():
    """The paper's toy task: 10k sequences (10% held out) and a model trained on it."""
    from captum_diffmask.evaluation.toy_task import generate_toy_data, train_toy_model

    train, valid = generate_toy_data(10_000, seed=0).split(0.1, seed=0)
    model, accuracy = train_toy_model(train, valid, seed=0)
    return model, accuracy, train, valid
