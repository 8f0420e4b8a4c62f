"""The GPU stacking-speed study on a QA model (benchmarks/studies/stacking_speed_qa.py), on a tiny config."""

import pytest

from benchmarks.studies import stacking_speed_qa


def test_every_choice_of_each_mode_gets_a_positive_step_time(monkeypatch):
    monkeypatch.setattr(stacking_speed_qa, "MINILM", {"vocab_size": 30522, "hidden_size": 16, "num_hidden_layers": 2,
                                                      "num_attention_heads": 2, "intermediate_size": 32,
                                                      "max_position_embeddings": 64})
    # five steps' difference: a pause of a busy machine in the shorter fit must not outweigh it
    seconds = stacking_speed_qa.measure("cpu", steps=6, warmup=1, batch_size=2, length=8)
    assert {mode: set(choices) for mode, choices in seconds.items()} == \
        {mode: set(choices) for mode, choices in stacking_speed_qa.CHOICES.items()}
    assert all(s > 0 for choices in seconds.values() for s in choices.values())


def test_the_steps_must_exceed_the_warmup():
    with pytest.raises(SystemExit):
        stacking_speed_qa.main(["--steps", "5", "--warmup", "5"])
