"""A fit killed part-way resumes from its checkpoint and ends with the probe of an
uninterrupted fit."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from captum_diffmask import DiffMask

from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")

#: One fit: a shuffled DataLoader (its order drawn from torch's RNG), three
#: epochs of four batches, one layer drawn per batch, a state written every 3
#: steps, the deployed KL measured every 4 (so the step after a resume reads a
#: value the state held); KILL_AT kills the process (no clean-up) in the
#: forward pass of that step.
SCRIPT = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    from torch.utils.data import DataLoader, TensorDataset
    from captum_diffmask import DiffMask
    from tiny_models import tiny_bert, token_batch
    torch.set_num_threads(1)
    ids = torch.cat([token_batch(seed=s)[0] for s in range(4)])
    mask = torch.cat([token_batch(seed=s)[1] for s in range(4)])
    loader = DataLoader(TensorDataset(ids, mask), batch_size=4, shuffle=True)
    model = tiny_bert()
    steps = []
    kill_at = int(os.environ.get("KILL_AT", "0"))
    def count(module, args, output):
        steps.append(1)
        if kill_at and len(steps) == kill_at:
            os._exit(3)
    model.bert.embeddings.register_forward_hook(count)
    dm = DiffMask(model, mode=sys.argv[1])
    history = dm.fit(loader, epochs=3, seed=0, verbose=False, lr=0.05, checkpoint=sys.argv[2],
                     compute={{"layers_per_batch": "one", "checkpoint_every": 3, "deployed_every": 4}})
    torch.save({{"probe": dm.probe.state_dict(), "lambdas": dm.lambdas.state_dict(),
                "history": [{{k: v for k, v in row.items() if k != "seconds"}} for row in history]}}, sys.argv[3])
""")


def _run(tmp_path, mode, name, kill_at=0):
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "KILL_AT": str(kill_at), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), mode, str(tmp_path / f"{name}.state"),
                           str(tmp_path / f"{name}.pt")], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_a_killed_fit_resumes_and_ends_with_the_probe_of_an_uninterrupted_fit(tmp_path, mode):
    whole = _run(tmp_path, mode, "whole")
    assert whole.returncode == 0, whole.stderr
    # killed in step 8 (each step: one capture pass and a few masked passes, all through the embeddings)
    killed = _run(tmp_path, mode, "parts", kill_at=20)
    assert killed.returncode == 3 and (tmp_path / "parts.state").exists() and not (tmp_path / "parts.pt").exists()
    state = torch.load(tmp_path / "parts.state", weights_only=True)  # tensors and plain values only
    assert 0 < state["state"]["step"] < 12 and state["state"]["step"] % 3 == 0 and not state["state"]["finished"]
    resumed = _run(tmp_path, mode, "parts")
    assert resumed.returncode == 0, resumed.stderr
    expected, got = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "parts.pt")
    for part in ("probe", "lambdas"):
        assert expected[part].keys() == got[part].keys()
        for key in expected[part]:
            assert torch.equal(expected[part][key], got[part][key]), (part, key)
    assert got["history"] == expected["history"]


def test_a_finished_fit_is_restored_not_trained_again_and_another_probe_is_refused(tmp_path):
    ids, mask = token_batch()
    path = tmp_path / "fit.state"
    first = DiffMask(tiny_bert(), mode="hidden")
    history = first.fit([(ids, mask)] * 2, epochs=2, seed=0, verbose=False, checkpoint=path)
    again = DiffMask(tiny_bert(), mode="hidden")
    calls = []
    again.model.bert.embeddings.register_forward_hook(lambda *args: calls.append(1))
    assert again.fit([(ids, mask)] * 2, epochs=2, seed=0, verbose=False, checkpoint=path) == history
    assert calls == []  # not one forward pass
    assert again.fit_record == first.fit_record and again.convergence == first.convergence
    assert torch.equal(again.attribute(ids, additional_forward_args=(mask,), layer=1),
                       first.attribute(ids, additional_forward_args=(mask,), layer=1))
    with pytest.raises(ValueError, match="checkpoint: .* another probe or other layers"):
        DiffMask(tiny_bert(), mode="input").fit([(ids, mask)], epochs=1, verbose=False, checkpoint=path)
    # the same architecture with other weights: a probe is its model's, so its state is refused
    with pytest.raises(ValueError, match="checkpoint: .* a fit on another model"):
        DiffMask(tiny_bert(seed=1), mode="hidden").fit([(ids, mask)] * 2, epochs=2, seed=0, verbose=False,
                                                       checkpoint=path)
    with pytest.raises(ValueError, match="checkpoint_every must be an int >= 1"):
        DiffMask(tiny_bert()).fit([(ids, mask)], epochs=1, verbose=False, checkpoint=path,
                                  compute={"checkpoint_every": 0})
    (tmp_path / "garbage.state").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="garbage.state is not a readable fit state"):
        DiffMask(tiny_bert()).fit([(ids, mask)], epochs=1, verbose=False, checkpoint=tmp_path / "garbage.state")



def _leaves(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


@pytest.mark.parametrize("options", [{}, {"optimization": {"optimizer": "lookahead-rmsprop", "multiplier": "damped",
                                                             "lr_lambda": 0.1}}])
def test_a_fit_state_holds_tensors_and_plain_values_and_an_old_pickled_one_is_refused_by_name(tmp_path, options):
    ids, mask = token_batch()
    path = tmp_path / "fit.state"
    DiffMask(tiny_bert(), mode="input").fit([(ids, mask)] * 2, epochs=2, seed=0, verbose=False, checkpoint=path,
                                            validation=[(ids, mask)], **options)
    state = torch.load(path, weights_only=True)
    kinds = {type(leaf) for leaf in _leaves(state)}
    assert kinds <= {torch.Tensor, int, float, str, bool, type(None)}, kinds
    # a state of format 1 held the library's objects: refused by name, not unpickled
    state["monitors"] = {0: torch.nn.Identity()}
    state["format"] = 1
    torch.save(state, tmp_path / "old.state")
    with pytest.raises(ValueError, match="old.state is a fit state of an earlier version .* not loaded"):
        DiffMask(tiny_bert(), mode="input").fit([(ids, mask)], epochs=1, verbose=False,
                                                checkpoint=tmp_path / "old.state")


def _hidden_fit(path, **cap):
    ids, mask = token_batch(batch=8)
    batches = [(ids[:4], mask[:4]), (ids[4:], mask[4:]), (ids, mask)]
    explainer = DiffMask(tiny_bert(), mode="hidden")
    history = explainer.fit(batches, seed=0, verbose=False, lr=0.05, checkpoint=path, compute={"checkpoint_every": 2},
                            **cap)
    return explainer, history


# three batches an epoch: 4 steps stop inside the second epoch, 2 epochs at its end
@pytest.mark.parametrize("short_cap, long_cap, smaller_cap", [
    ({"max_steps": 4}, {"max_steps": 7}, {"max_steps": 5}),
    ({"epochs": 2}, {"epochs": 3}, {"epochs": 2}),
])
def test_a_fit_stopped_by_its_cap_goes_on_with_a_larger_cap_and_ends_as_one_fit_with_that_cap(
        tmp_path, short_cap, long_cap, smaller_cap):
    whole, whole_history = _hidden_fit(tmp_path / "whole.state", **long_cap)
    short, short_history = _hidden_fit(tmp_path / "parts.state", **short_cap)
    assert max(row["epoch"] for row in short_history) == 2
    assert all(report["status"] not in ("converged", "needed") for report in short.convergence.values())
    longer, history = _hidden_fit(tmp_path / "parts.state", **long_cap)
    for part in ("probe", "lambdas"):
        expected, got = getattr(whole, part).state_dict(), getattr(longer, part).state_dict()
        for key in expected:
            assert torch.equal(expected[key], got[key]), (part, key)
    assert [(r["epoch"], r["layer"], r["steps"]) for r in history] == [
        (r["epoch"], r["layer"], r["steps"]) for r in whole_history]
    for got, expected in zip(history, whole_history):
        assert got["kl"] == pytest.approx(expected["kl"], rel=1e-9) and got["l0"] == pytest.approx(expected["l0"], rel=1e-9)
    assert {k: r["steps"] for k, r in longer.convergence.items()} == {k: r["steps"] for k, r in whole.convergence.items()}
    assert max(r["steps"] for r in longer.convergence.values()) > max(r["steps"] for r in short.convergence.values())
    # a cap below where it ended: the fit as it is, not trained again
    again, again_history = _hidden_fit(tmp_path / "parts.state", **smaller_cap)
    assert again_history == history


def test_a_fit_stopped_in_its_cool_down_goes_on_at_the_cooled_rates_and_ends_as_one_fit(tmp_path):
    # every window meets the criterion: all layers settle at step 30 (window 10,
    # patience 2), then 30 steps of cool-down at a tenth of the rates
    loose = {"window": 10, "patience": 2, "tol_kept": 1.0, "tol_lambda": 100.0, "tol_kl": 1e6, "open_share": 1.1,
             "cooldown": 30}
    batches = [token_batch(batch=4, length=9, seed=i) for i in range(3)]

    def fit(name, **cap):
        explainer = DiffMask(tiny_bert(), mode="hidden")
        explainer.fit(batches, seed=0, verbose=False, checkpoint=tmp_path / name, convergence=loose,
                      compute={"checkpoint_every": 2}, **cap)
        return explainer

    whole = fit("whole.state")
    assert whole.fit_record["ended"] == "cooldown" and whole.fit_record["steps"] == 60
    assert fit("parts.state", max_steps=45).fit_record["ended"] == "max_steps"
    with warnings.catch_warnings(record=True) as caught:  # its cooled rates are the ones this call's lr gives
        warnings.simplefilter("always")
        longer = fit("parts.state", max_steps=100)
    assert not [w for w in caught if "no effect on a resumed fit" in str(w.message)]
    assert longer.fit_record["ended"] == "cooldown" and longer.fit_record["steps"] == 60
    for part in ("probe", "lambdas"):
        expected, got = getattr(whole, part).state_dict(), getattr(longer, part).state_dict()
        for key in expected:
            assert torch.equal(expected[key], got[key]), (part, key)


def test_a_resumed_fit_says_that_this_calls_rates_have_no_effect(tmp_path):
    def rates_warnings(**options):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _hidden_fit(tmp_path / "fit.state", **options)
        return [str(w.message) for w in caught if "have no effect on a resumed fit" in str(w.message)]

    assert rates_warnings(max_steps=2) == []  # a new fit
    assert rates_warnings(max_steps=4) == []  # resumed at the rates it was written with (lr 0.05)
    ids, mask = token_batch(batch=8)
    explainer = DiffMask(tiny_bert(), mode="hidden")
    with pytest.warns(UserWarning, match=r"lr=0\.05, lr_baseline=0\.001\); this call's lr=0\.2, lr_baseline=0\.001 "):
        explainer.fit([(ids, mask)], seed=0, verbose=False, lr=0.2, checkpoint=tmp_path / "fit.state", max_steps=6,
                      compute={"checkpoint_every": 2})
