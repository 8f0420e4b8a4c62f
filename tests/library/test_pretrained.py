"""save_pretrained / from_pretrained: a directory of safetensors, JSON and a
model card that reloads to the same attributions, runs no code when read, and
is refused for another model or other weights."""

import json
import pickle

import pytest
import torch

from captum_diffmask import DiffMask

from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


@pytest.fixture(scope="module")
def fitted():
    ids, mask = token_batch()
    model = tiny_bert(seed=0)
    dm = DiffMask(model, mode="input")
    dm.fit([(ids, mask)] * 3, max_steps=6, seed=0, verbose=False)
    return dm, model, ids, mask


def test_a_saved_directory_reloads_to_identical_attributions_and_holds_no_pickle(fitted, tmp_path, monkeypatch):
    dm, model, ids, mask = fitted
    dm.save_pretrained(tmp_path / "probe")
    assert sorted(p.name for p in (tmp_path / "probe").iterdir()) == \
        ["README.md", "config.json", "fit_record.json", "probe.safetensors"]

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a saved directory must load without unpickling")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    loaded = DiffMask.from_pretrained(tmp_path / "probe", model)
    for layer in (0, 1, 2, None):
        assert torch.equal(loaded.attribute(ids, additional_forward_args=(mask,), layer=layer),
                           dm.attribute(ids, additional_forward_args=(mask,), layer=layer))
    assert set(loaded.convergence) == set(dm.convergence)
    for layer, report in dm.convergence.items():
        assert loaded.convergence[layer]["status"] == report["status"]
        assert loaded.convergence[layer]["windows"] == report["windows"]  # JSON keeps a float exactly
    assert loaded.fit_record["steps"] == 6 and loaded.fit_record["options"]["eps"] == 0.1
    assert loaded.fit_record["batches_per_epoch"] == 3 and loaded.fit_record["examples_per_epoch"] == 12


def test_the_model_card_says_what_it_explains_how_it_was_fitted_and_each_verdict(fitted, tmp_path):
    dm, model, _, _ = fitted
    dm.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    config = json.loads((tmp_path / "config.json").read_text())
    assert card.startswith("# DiffMask probe for a `BertForSequenceClassification`")
    assert config["weights"] in card and "DiffMask.from_pretrained(" in card
    epochs = dm.fit_record["epochs"]
    assert f"6 steps over {epochs} epochs (3 batches per epoch, 12 examples per epoch)" in card
    for layer, report in dm.convergence.items():
        assert f"| {layer} | {report['status']} | {report['steps']} |" in card


def test_another_model_other_weights_and_missing_files_are_refused_by_name(fitted, tmp_path):
    dm, model, _, _ = fitted
    folder = tmp_path / "probe"
    dm.save_pretrained(folder)
    with pytest.raises(ValueError, match="other weights .*check_weights=False"):
        DiffMask.from_pretrained(folder, tiny_bert(seed=1))
    assert DiffMask.from_pretrained(folder, tiny_bert(seed=1), check_weights=False).is_fitted
    with pytest.raises(ValueError, match="model: the checkpoint was fitted on a model with sites"):
        DiffMask.from_pretrained(folder, tiny_bert(num_layers=3))
    config = json.loads((folder / "config.json").read_text())
    config["weights"] = "0" * 40  # a tampered fingerprint: the model's weights no longer match it
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="other weights"):
        DiffMask.from_pretrained(folder, model)
    (folder / "probe.safetensors").unlink()
    with pytest.raises(ValueError, match="probe.safetensors is missing"):
        DiffMask.from_pretrained(folder, model)
    with pytest.raises(ValueError, match="is not a directory"):
        DiffMask.from_pretrained(tmp_path / "nowhere", model)
    unfitted = DiffMask(model, mode="input")
    with pytest.raises(ValueError, match="not fitted"):
        unfitted.save_pretrained(tmp_path / "empty")
