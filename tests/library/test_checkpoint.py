"""Checkpoints: round trips, and refusals that name what is wrong."""

import pytest
import torch

from captum_diffmask import DiffMask

from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


def _fitted(model):
    ids, mask = token_batch()
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    return dm


def test_truncated_and_garbage_files_are_refused_by_name(tmp_path):
    path = tmp_path / "dm.pt"
    _fitted(tiny_bert()).save(path)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated.pt is not a readable DiffMask checkpoint"):
        DiffMask.load(truncated, tiny_bert())
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(ValueError, match="garbage.pt is not a readable DiffMask checkpoint"):
        DiffMask.load(garbage, tiny_bert())
    other = tmp_path / "other.pt"
    torch.save({"weights": 1}, other)
    with pytest.raises(ValueError, match="other.pt is not a DiffMask checkpoint"):
        DiffMask.load(other, tiny_bert())
    with pytest.raises(ValueError, match="does not exist"):
        DiffMask.load(tmp_path / "missing.pt", tiny_bert())


def test_a_model_with_other_weights_is_refused_unless_asked(tmp_path):
    path = tmp_path / "dm.pt"
    dm = _fitted(tiny_bert(seed=0))
    dm.save(path)
    assert DiffMask.load(path, tiny_bert(seed=0)).is_fitted  # the same weights, rebuilt: accepted
    other = tiny_bert(seed=1)  # the same architecture, other values
    with pytest.raises(ValueError, match="other weights .*check_weights=False"):
        DiffMask.load(path, other)
    loaded = DiffMask.load(path, other, check_weights=False)
    assert loaded.is_fitted


def test_an_input_mode_checkpoint_from_before_per_depth_votes_loads_as_shared_votes(tmp_path):
    # written before the `votes` option: no "votes" in its config, one input
    # baseline stored as "baseline"
    ids, mask = token_batch()
    model = tiny_bert()
    dm = DiffMask(model, mode="input", votes="tied")
    dm.fit([(ids, mask)] * 2, max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    path = tmp_path / "old.pt"
    dm.save(path)
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["config"]["votes"]
    checkpoint["probe"]["baseline"] = checkpoint["probe"].pop("baselines.0")
    torch.save(checkpoint, path)
    loaded = DiffMask.load(path, model)
    assert loaded.votes == "tied"
    torch.testing.assert_close(loaded.learned_baseline(2), dm.learned_baseline(0))
    for k in (0, dm.num_layers):
        assert torch.equal(loaded.attribute(ids, additional_forward_args=(mask,), layer=k),
                           dm.attribute(ids, additional_forward_args=(mask,), layer=k))


def test_the_verdicts_are_saved_with_the_probe_and_a_checkpoint_without_them_says_so(tmp_path):
    from captum_diffmask.interface.verdicts import layer_verdict, NOT_RECORDED

    model = tiny_bert()
    dm = _fitted(model)
    path = tmp_path / "dm.pt"
    dm.save(path)
    loaded = DiffMask.load(path, model)
    assert loaded.convergence == dm.convergence and set(loaded.convergence) == set(range(dm.num_layers + 1))
    assert [layer_verdict(loaded, k) for k in range(dm.num_layers + 1)] == \
        [dm.convergence[k]["status"] for k in range(dm.num_layers + 1)]
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["convergence"]  # written before checkpoints held the verdicts
    torch.save(checkpoint, path)
    assert layer_verdict(DiffMask.load(path, model), 0) == NOT_RECORDED
