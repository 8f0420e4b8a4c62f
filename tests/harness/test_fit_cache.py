"""The MiniLM suites' fit cache on a tiny BERT and hand-made sentences: a fit is
stored when it ends, loaded (not refitted) by a call with the same key, refitted
when any part of the key changes, resumed from the state an unfinished call
left, and gone on with from where its cap stopped it when the cap is raised."""

import json

import pytest
import torch

from benchmarks.common.minilm.fit_cache import cached_fit, certified_fit, fit_files, fit_key, fitted_where
from benchmarks.common.minilm.fitting import certify_fit, fit_diffmask
from benchmarks.tasks.squad import SquadFeatures
from benchmarks.tasks.sst_bert import EncodedSST
from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.diffmask.constrained.convergence.DiffMaskConvergenceWarning")

CONFIG = {
    "diffmask": {"batch_size": 8, "l0": "mean", "eps": 0.1, "max_steps": 3, "select_checkpoint": False,
                 "validation_sentences": 8, "input": {}, "hidden": {"eps": 0.05}},
    "cache": True,
}


def _sentences(rows: int, seed: int) -> EncodedSST:
    ids, mask = token_batch(rows, 7, seed)
    return EncodedSST(ids, mask, ids[:, 0] % 3, torch.zeros_like(ids))


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path))
    return tiny_bert(), _sentences(16, 0), _sentences(8, 1)


def _counting(calls):
    def fit(*args, **kwargs):
        calls.append(kwargs.get("checkpoint"))
        return fit_diffmask(*args, **kwargs)
    return fit


def _scores(explainer, data):
    return explainer.attribute(data.input_ids, additional_forward_args=(data.attention_mask,), layer=None)


def test_a_stored_fit_is_loaded_not_refitted(bench, tmp_path):
    model, train, valid = bench
    calls = []
    first, info = cached_fit(_counting(calls), model, "hidden", train, valid, CONFIG, 0, False)
    files = fit_files(model, "hidden", train, valid, CONFIG, 0)
    assert calls == [str(files.state)] and files.probe.exists() and files.record.exists() and info["resumed"] is False
    assert files.state.exists()  # 3 steps settle no layer: the state stays, for a larger cap to go on from
    again, stored = cached_fit(_counting(calls), model, "hidden", train, valid, CONFIG, 0, False)
    assert len(calls) == 1 and stored["stored"]["max_steps"] == 3 and set(stored["stored"]) == {"commit", "date", "max_steps"}
    assert again.convergence == {int(k): v for k, v in json.loads(json.dumps(first.convergence)).items()}
    assert stored["steps"] == info["steps"] and stored["heldout"] == json.loads(json.dumps(info["heldout"]))
    assert torch.allclose(_scores(again, valid), _scores(first, valid))


def test_any_part_of_the_key_refits(bench):
    model, train, valid = bench
    calls = []
    cached_fit(_counting(calls), model, "input", train, valid, CONFIG, 0, False)
    cached_fit(_counting(calls), model, "input", train, valid, CONFIG, 1, False)  # the seed
    looser = {**CONFIG, "diffmask": {**CONFIG["diffmask"], "eps": 0.2}}
    cached_fit(_counting(calls), model, "input", train, valid, looser, 0, False)  # a setting
    cached_fit(_counting(calls), model, "input", _sentences(16, 5), valid, CONFIG, 0, False)  # the sentences
    other = tiny_bert(seed=3)
    cached_fit(_counting(calls), other, "input", train, valid, CONFIG, 0, False)  # the weights
    assert len(calls) == 5 and len(set(calls)) == 5
    # the mode's own settings are the mode's: hidden's eps 0.05 is in its key, not input's
    assert fit_key(model, "hidden", train, valid, CONFIG, 0)["settings"]["eps"] == 0.05
    assert fit_key(model, "input", train, valid, CONFIG, 0)["settings"]["eps"] == 0.1


def test_a_record_of_another_key_is_not_read(bench):
    model, train, valid = bench
    calls = []
    cached_fit(_counting(calls), model, "input", train, valid, CONFIG, 0, False)
    files = fit_files(model, "input", train, valid, CONFIG, 0)
    record = json.loads(files.record.read_text())
    record["key"]["seed"] = 7
    files.record.write_text(json.dumps(record))
    assert files.stored() is None
    cached_fit(_counting(calls), model, "input", train, valid, CONFIG, 0, False)
    assert len(calls) == 2


def test_an_unfinished_fit_resumes_from_its_state(bench):
    model, train, valid = bench
    files = fit_files(model, "hidden", train, valid, CONFIG, 0)
    files.state.parent.mkdir(parents=True, exist_ok=True)
    # a call that was stopped after its fit wrote its state, before it was stored
    direct, _ = fit_diffmask(model, "hidden", train, valid, CONFIG, 0, False, checkpoint=str(files.state))
    assert files.state.exists() and not files.probe.exists()
    calls = []
    resumed, info = cached_fit(_counting(calls), model, "hidden", train, valid, CONFIG, 0, False)
    assert calls == [str(files.state)] and info["resumed"] is True and "went_on_from_cap" not in info
    assert torch.equal(_scores(resumed, valid), _scores(direct, valid))


def _capped(cap):
    return {**CONFIG, "diffmask": {**CONFIG["diffmask"], "max_steps": cap}}


def test_the_cap_is_not_in_the_key_and_a_larger_one_goes_on_from_where_the_smaller_stopped(bench):
    model, train, valid = bench
    assert fit_key(model, "hidden", train, valid, _capped(3), 0) == fit_key(model, "hidden", train, valid, _capped(6), 0)
    calls = []
    cached_fit(_counting(calls), model, "hidden", train, valid, _capped(3), 0, False)
    longer, info = cached_fit(_counting(calls), model, "hidden", train, valid, _capped(6), 0, False)
    assert len(calls) == 2 and info["resumed"] is True and info["went_on_from_cap"] == 3
    direct, direct_info = fit_diffmask(model, "hidden", train, valid, _capped(6), 0, False)
    assert info["steps"] == direct_info["steps"] == 6
    assert torch.equal(_scores(longer, valid), _scores(direct, valid))
    # the stored fit now answers cap 6, not cap 3 (its layers did not settle): cap 3 is fitted afresh
    assert fit_files(model, "hidden", train, valid, _capped(6), 0).stored() is not None
    assert fit_files(model, "hidden", train, valid, _capped(3), 0).stored() is None
    files = fit_files(model, "hidden", train, valid, _capped(3), 0)
    files.state.write_bytes(b"the cap-6 fit's state")  # a fresh fit must not read it, nor leave the cap-6 record
    shorter, info = cached_fit(_counting(calls), model, "hidden", train, valid, _capped(3), 0, False)
    assert len(calls) == 3 and info["resumed"] is False and info["steps"] == 3
    assert files.any_cap()["max_steps"] == 3


def test_a_fit_settled_within_its_cap_is_the_fit_of_any_larger_cap(bench):
    model, train, valid = bench
    cached_fit(_counting([]), model, "hidden", train, valid, _capped(3), 0, False)
    files = fit_files(model, "hidden", train, valid, _capped(3), 0)
    record = json.loads(files.record.read_text())
    record["info"]["convergence"] = {k: {**v, "status": "converged"} for k, v in record["info"]["convergence"].items()}
    files.record.write_text(json.dumps(record))  # as if every layer had settled by step 3
    assert fit_files(model, "hidden", train, valid, _capped(50), 0).stored() is not None
    assert fit_files(model, "hidden", train, valid, _capped(2), 0).stored() is None  # it ran past 2 steps
    record["info"]["convergence"]["0"]["status"] = "unsettled"
    files.record.write_text(json.dumps(record))
    assert fit_files(model, "hidden", train, valid, _capped(50), 0).stored() is None


def test_without_the_cache_nothing_is_written(bench, tmp_path):
    model, train, valid = bench
    calls = []
    cached_fit(_counting(calls), model, "input", train, valid, {**CONFIG, "cache": False}, 0, False)
    assert calls == [None] and not list(tmp_path.glob("diffmask-fit-*"))


def _windows(rows: int, seed: int, answer_shift: int = 0) -> SquadFeatures:
    ids, mask = token_batch(rows, 7, seed)
    starts = (ids[:, 1] % 5) + answer_shift
    return SquadFeatures(ids, mask, torch.zeros_like(ids), starts, starts + 1, torch.arange(rows),
                         [[None] * 7 for _ in range(rows)], [[None] * 7 for _ in range(rows)])


def test_squad_windows_are_fitted_through_the_same_cache(bench):
    model, _, _ = bench
    train, valid = _windows(16, 0), _windows(8, 1)
    calls = []
    first, info = cached_fit(_counting(calls), model, "input", train, valid, CONFIG, 0, False)
    again, stored = cached_fit(_counting(calls), model, "input", train, valid, CONFIG, 0, False)
    assert len(calls) == 1 and stored["stored"]["max_steps"] == 3
    assert torch.allclose(_scores(again, valid), _scores(first, valid))
    # the windows' answers are part of what names the fit
    moved = _windows(16, 0, answer_shift=1)
    assert fit_key(model, "input", moved, valid, CONFIG, 0)["train"] != fit_key(model, "input", train, valid, CONFIG, 0)["train"]


def test_a_record_says_where_its_fit_ran():
    stored = {"stored": {"commit": "abc", "date": "2026-11-28"}}
    assert fitted_where({}) == "this run"
    assert fitted_where({"resumed": True}) == "this run, resumed from a stopped fit's state"
    assert fitted_where({**stored, "resumed": True, "went_on_from_cap": 2500}) == (
        "fit cache (commit abc, 2026-11-28), went on from the state of the fit the cap max_steps=2500 stopped")


def test_the_certificate_is_measured_once_kept_with_the_fit_and_not_in_its_key(bench):
    model, train, valid = bench
    certified = {**CONFIG, "diffmask": {**CONFIG["diffmask"], "certificate": {"steps": 4, "closure_examples": 2}}}
    assert fit_key(model, "hidden", train, valid, certified, 0) == fit_key(model, "hidden", train, valid, CONFIG, 0)
    measured = []

    def certify(*args, **kwargs):
        measured.append(args[1])
        return certify_fit(*args, **kwargs)

    _, info = certified_fit(fit_diffmask, certify, model, "hidden", train, valid, certified, 0, False)
    assert measured == ["hidden"] and info["certificate"]["tolerances"]["steps"] == 4
    assert sorted(info["certificate"]["layers"]) == ["0", "1", "2"]
    files = fit_files(model, "hidden", train, valid, certified, 0)
    # the fit's state is kept, and the further steps went on from it
    assert files.state.exists() and info["certificate"]["continued"] is True
    record = json.loads(files.record.read_text())
    assert record["info"]["certificate"] == json.loads(json.dumps(info["certificate"]))
    _, again = certified_fit(fit_diffmask, certify, model, "hidden", train, valid, certified, 0, False)
    assert measured == ["hidden"] and again["certificate"] == record["info"]["certificate"]  # from the record
    # a certificate of fresh optimiser states, stored beside the fit's state, is measured again from the state
    files.add_to_record({"certificate": {**record["info"]["certificate"], "continued": False}})
    _, redone = certified_fit(fit_diffmask, certify, model, "hidden", train, valid, certified, 0, False)
    assert measured == ["hidden"] * 2 and redone["certificate"] == record["info"]["certificate"]
    longer = {**certified, "diffmask": {**certified["diffmask"], "certificate": {"steps": 6, "closure_examples": 2}}}
    _, other = certified_fit(fit_diffmask, certify, model, "hidden", train, valid, longer, 0, False)
    assert measured == ["hidden"] * 3 and other["certificate"]["tolerances"]["steps"] == 6
    _, none = certified_fit(fit_diffmask, certify, model, "hidden", train, valid, CONFIG, 0, False)
    assert len(measured) == 3  # no certificate asked for: none measured
