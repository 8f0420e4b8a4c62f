"""calibrate_eps: the sparsest rung of the ladder that keeps the target with every
probe settled, its frontier, the probe restored to that rung, and the reason."""

import json

import pytest
import torch

from captum_diffmask import calibrate_eps, Convergence, DiffMask

from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")

#: agreement and verdict per rung, as the scripted fits leave them
SCRIPT = {0.01: (1.0, "converged"), 0.1: (0.97, "needed"), 1.0: (0.90, "converged"), 10.0: (0.5, "converged")}


class _Fitted(list):
    r"""The rungs fitted, in order, and the options each fit was given (``given``)."""


@pytest.fixture
def scripted(monkeypatch):
    r"""DiffMask.fit and evaluate replaced by a script: each fit marks its probe
    with its eps (the first baseline's first value), so the restored probe says
    which rung it is."""
    fitted = _Fitted()
    given = []

    def fit(self, data, eps, **options):
        given.append(options)
        if self.probe is None:
            self.site_sizes = {name: 32 for name in ["input"] + [f"hidden.{k}" for k in range(3)]}
            self._make_modules()
        with torch.no_grad():
            next(self.probe.parameters()).view(-1)[0] = eps
        self.fitted_layers = [0, 1, 2]
        self.convergence = {k: {"status": SCRIPT[eps][1]} for k in range(3)}
        fitted.append(eps)
        return []

    def evaluate(self, data, layers=None):
        return {k: {"agreement": SCRIPT[fitted[-1]][0], "kl": fitted[-1] / 2, "l0": 1 / (1 + fitted[-1])}
                for k in range(3)}

    monkeypatch.setattr(DiffMask, "fit", fit)
    monkeypatch.setattr(DiffMask, "evaluate", evaluate)
    fitted.given = given
    return fitted


def test_the_sparsest_rung_that_keeps_the_target_is_chosen_and_its_probe_restored(scripted):
    result = calibrate_eps(tiny_bert(), [], [], agreement=0.95, ladder=(10.0, 0.1, 1.0, 0.01))
    assert scripted == [0.1, 1.0]  # the middle first, cold; the climb stops at the first miss
    # the warm rung gets half a cold fit's windows (Convergence().max_windows) to settle
    half = Convergence().max_windows // 2
    assert "convergence" not in scripted.given[0] and scripted.given[1]["convergence"] == {"max_windows": half}
    assert result.eps == 0.1 and result.meets(0.1) and not result.meets(1.0)
    assert next(result.explainer.probe.parameters()).view(-1)[0].item() == pytest.approx(0.1)
    assert result.explainer.convergence[0]["status"] == "needed"
    assert "eps 0.1 is the sparsest rung" in result.reason and "agreement below 0.95" in result.reason
    assert result.rungs() == [0.1, 1.0] and len(result.frontier) == 2 * 3
    assert {r["masked"] for r in result.frontier if r["eps"] == 1.0} == {0.5}
    assert json.loads(json.dumps(result.to_dict()))["eps"] == 0.1


def test_a_middle_rung_that_misses_walks_tighter_to_the_first_that_meets(scripted):
    result = calibrate_eps(tiny_bert(), [], [], agreement=0.98, ladder=(0.01, 0.1, 1.0, 10.0))
    assert scripted == [0.1, 0.01] and result.eps == 0.01
    assert next(result.explainer.probe.parameters()).view(-1)[0].item() == pytest.approx(0.01)
    assert result.reason.startswith("eps 0.01 is the sparsest rung that meets the target; the next, eps 0.1, misses it")


def test_no_rung_that_meets_the_target_says_so_and_unsettled_rungs_do_not_count(scripted):
    result = calibrate_eps(tiny_bert(), [], [], agreement=0.99, ladder=(0.1, 1.0))
    assert result.eps is None and result.explainer is None
    assert result.reason.startswith("no rung meets the target: the tightest, eps 0.1, misses it")
    SCRIPT[0.5] = (1.0, "unsettled")
    try:
        unsettled = calibrate_eps(tiny_bert(), [], [], agreement=0.9, ladder=(0.01, 0.5, 1.0))
    finally:
        del SCRIPT[0.5]
    assert unsettled.eps == 0.01 and "layers not settled: 0 (unsettled)" in unsettled.reason
    assert "give the fits more steps" in unsettled.reason  # the looser rung kept the agreement


def test_a_rung_that_keeps_the_agreement_but_has_not_settled_asks_for_steps_not_a_tighter_ladder(scripted):
    SCRIPT[0.02] = (1.0, "unsettled")
    try:
        result = calibrate_eps(tiny_bert(), [], [], agreement=0.9, ladder=(0.02,))
    finally:
        del SCRIPT[0.02]
    assert result.eps is None and result.reason.startswith(
        "no rung meets the target: the tightest, eps 0.02, misses it (layers not settled: 0 (unsettled), "
        "1 (unsettled), 2 (unsettled)); it keeps the agreement at every layer and missed only because its probes "
        "did not settle: give the fits more steps (raise max_steps or epochs")
    assert result.reason.endswith("not a tighter ladder")
    # a rung that misses the agreement still asks for a tighter ladder
    missed = calibrate_eps(tiny_bert(), [], [], agreement=0.99, ladder=(0.1, 1.0))
    assert missed.reason.endswith("; try a tighter ladder") and "did not settle" not in missed.reason


def test_clear_errors_name_the_argument():
    model = tiny_bert()
    with pytest.raises(ValueError, match="agreement must be in"):
        calibrate_eps(model, [], [], agreement=1.5)
    with pytest.raises(ValueError, match="ladder must hold"):
        calibrate_eps(model, [], [], ladder=(0.0, 0.1))
    with pytest.raises(ValueError, match="give ladder="):
        calibrate_eps(model, [], [], eps=0.1)
    with pytest.raises(ValueError, match="warm_windows must be an int >= 4"):
        calibrate_eps(model, [], [], warm_windows=2)


def test_a_real_ladder_on_a_tiny_bert_scores_every_rung_on_the_held_out_batches(tmp_path):
    ids, mask = token_batch()
    result = calibrate_eps(tiny_bert(), [(ids, mask)] * 2, [(ids, mask)], agreement=0.5, ladder=(0.05, 0.5),
                           max_steps=4, seed=0, verbose=False)
    # four steps settle nothing: the tightest rung is not counted, and the frontier says why
    assert result.eps is None and "layers not settled" in result.reason
    assert {row["layer"] for row in result.frontier} == {0, 1, 2}
    assert all(0 <= row["agreement"] <= 1 and 0 <= row["masked"] <= 1 for row in result.frontier)
    result.plot(tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 0
