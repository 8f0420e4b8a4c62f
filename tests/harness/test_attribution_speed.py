"""The attribution-speed study (benchmarks.studies.attribution_speed) on a tiny BERT
and a few dozen SST sentences: both modes and the one-copy-per-vote reference timed,
an input-mode fit step both ways, the reference's probe the same attributions, the
report written."""

import json
import warnings

import torch

from benchmarks.studies import attribution_speed
from captum_diffmask import DiffMask
from tiny_models import needs_sst, tiny_bert

OVERRIDES = {"train_sentences": 64, "cache": False,
             "model": {"source": "tiny", "epochs": 1, "batch_size": 16, "lr": 1e-3},
             "diffmask": {"batch_size": 8, "validation_sentences": 16},
             "speed": {"sentences": 8, "batch_size": 4, "fit_steps": 2, "fit_rounds": 1}}


@needs_sst
def test_both_modes_and_the_reference_are_timed_and_reported(tmp_path):
    out = tmp_path / "speed.md"
    assert attribution_speed.main(["--markdown", str(out), "--threads", "1", "--set", json.dumps(OVERRIDES)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    labels = {"forward", "DiffMask input", "DiffMask hidden", attribution_speed.ONE_COPY_PER_VOTE,
              "forward (second measurement)"}
    assert set(result["per_sentence_seconds"]) == labels
    assert all(v > 0 for v in result["per_sentence_seconds"].values())
    assert result["ratio_to_forward"]["forward"] == 1.0 and result["sentences"] == 8
    steps = result["fit_step_seconds"]
    assert steps["steps"] == 2 and steps["shared"] > 0 and steps["one copy per vote"] > 0
    text = out.read_text()
    assert "(target <= 1.5x)" in text and attribution_speed.ONE_COPY_PER_VOTE in text and "A fit step in input mode" in text


def test_the_reference_attributes_the_same_with_one_copy_per_vote():
    # what the study times as its reference is the same attribution, computed apart
    model = tiny_bert()
    ids = torch.randint(5, 50, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, 5:] = 0
    explainer = DiffMask(model, mode="input", l0="mean")
    with warnings.catch_warnings():  # three steps have no verdict, and say so
        warnings.simplefilter("ignore")
        explainer.fit([(ids, mask)] * 2, max_steps=3, lr=0.1, seed=0, verbose=False,
                      convergence={"until_converged": False})
    shared = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    with attribution_speed.one_copy_per_network():
        apart = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert shared.shape == (3, 7, 3) and shared.std() > 0.01
    torch.testing.assert_close(apart, shared, atol=1e-6, rtol=0)
