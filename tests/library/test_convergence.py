"""The convergence criterion of DiffMask.fit and its warnings."""

import warnings

import pytest

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.convergence import (
    Convergence, DiffMaskConvergenceWarning, LayerMonitor, least_tol_lambda, warn_unconverged,
)

CRITERION = Convergence(window=10, patience=2, needed_windows=4)  # 3 windows, for short tests


def _feed(monitor, windows, kl, kept, lam):
    r"""``windows`` windows of steps; kept and lam may be callables of the window index."""
    for i in range(windows):
        for _ in range(CRITERION.window):
            monitor.record(kl, kept(i) if callable(kept) else kept, lam(i) if callable(lam) else lam)


def test_settled_layer_within_eps_converges_only_after_patience_windows():
    monitor = LayerMonitor(3, KLConstraint(0.1), CRITERION)
    _feed(monitor, 2, kl=0.09, kept=0.4, lam=2.0)
    assert monitor.status() == "unsettled"  # two windows: one comparison < patience 2
    _feed(monitor, 1, kl=0.09, kept=0.405, lam=2.3)
    assert monitor.status() == "converged"
    report = monitor.report()
    assert report["converged"] and report["steps"] == 30 and report["layer"] == 3
    assert report["windows"][-1]["kept"] == pytest.approx(0.405)


@pytest.mark.parametrize("kept, lam", [
    (lambda i: 0.6 - 0.02 * i, 2.0),  # the kept share still falls 0.02 a window (> 0.01)
    (0.4, lambda i: 2.0 * 2.0 ** i),  # the multiplier still doubles every window (> 50 %)
    (0.9, lambda i: 20.0 - 3.0 * i),  # most gates held open while lambda falls from a spike
])
def test_moving_kept_share_or_multiplier_is_unsettled(kept, lam):
    monitor = LayerMonitor(0, KLConstraint(0.1), CRITERION)
    _feed(monitor, 6, kl=0.09, kept=kept, lam=lam)
    assert monitor.status() == "unsettled"
    assert "still moving" in monitor.advice() and "raise the cap" in monitor.advice()


@pytest.mark.parametrize("kl, kept, status", [
    (0.2, 0.4, "violated"),     # KL 2x eps
    (0.01, 0.99, "open"),       # every gate open while the KL is far inside eps
    (0.09, 0.99, "open"),       # open with the KL near eps: needed, or stuck; never "converged"
    (0.09, 0.9, "converged"),   # a tenth of the gates closed with the constraint active
    (0.8, 0.002, "collapsed"),  # every gate closed, the constraint broken
    (0.0, 0.002, "closed"),     # every gate closed within it: not read at all
])
def test_statuses_of_a_settled_layer(kl, kept, status):
    monitor = LayerMonitor(1, KLConstraint(0.1), CRITERION)
    _feed(monitor, 4, kl=kl, kept=kept, lam=1.0)
    assert monitor.status() == status


def test_all_closed_advice_tells_a_collapse_from_a_layer_not_needed():
    collapsed, unneeded = LayerMonitor(1, KLConstraint(0.1), CRITERION), LayerMonitor(1, KLConstraint(0.1), CRITERION)
    _feed(collapsed, 4, kl=0.8, kept=0.002, lam=5.0)
    _feed(unneeded, 4, kl=0.05, kept=0.002, lam=0.5)
    assert "collapsed" in collapsed.advice() and "lr_lambda" in collapsed.advice()
    assert "does not look to need" in unneeded.advice() and "collapsed" not in unneeded.advice()
    assert not collapsed.report()["converged"] and not unneeded.report()["converged"]


@pytest.mark.parametrize("kept", [0.2, 0.002])  # violated, collapsed
def test_a_violated_layer_at_the_multipliers_ceiling_is_told_to_raise_it_or_leave_the_sum_l0(kept):
    ceiling, below = (LayerMonitor(2, KLConstraint(0.1), CRITERION, lambda_max=200.0) for _ in range(2))
    _feed(ceiling, 4, kl=0.4, kept=kept, lam=200.0)
    _feed(below, 4, kl=0.4, kept=kept, lam=150.0)
    assert ceiling.status() == below.status() == ("violated" if kept > 0.01 else "collapsed")
    advice = ceiling.advice()
    assert "multiplier at its ceiling (lambda_max 200)" in advice and "Raise optimization lambda_max" in advice
    assert 'l0="expected"' in advice and 'l0="mean"' in advice
    assert "ceiling" not in below.advice() and "ceiling" not in LayerMonitor(2, KLConstraint(0.1), CRITERION).advice()


def test_all_open_advice_tells_slack_from_a_binding_constraint():
    slack, binding = LayerMonitor(1, KLConstraint(0.1), CRITERION), LayerMonitor(1, KLConstraint(0.1), CRITERION)
    _feed(slack, 4, kl=0.01, kept=0.99, lam=0.0)
    _feed(binding, 4, kl=0.09, kept=0.99, lam=1.1)
    assert "constraint is slack" in slack.advice() and "not started to close" in slack.advice()
    assert "KL near eps" in binding.advice() and "larger eps" in binding.advice()
    assert "constraint is slack" not in binding.advice()


def test_warning_names_each_unconverged_layer_with_its_figures():
    good, bad = LayerMonitor(0, KLConstraint(0.1), CRITERION), LayerMonitor(2, KLConstraint(0.1), CRITERION)
    _feed(good, 4, kl=0.09, kept=0.4, lam=1.0)
    _feed(bad, 4, kl=0.01, kept=0.995, lam=0.0)
    with pytest.warns(DiffMaskConvergenceWarning) as caught:
        warn_unconverged({0: good, 2: bad}, "the cap epochs=7 (280 steps)")
    text = str(caught[0].message)
    assert text.startswith("DiffMask.fit stopped at the cap epochs=7 (280 steps) before every layer converged")
    assert "layer 2" in text and "layer 0" not in text
    assert "kept share 0.995" in text and "eps 0.1" in text and "all open" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unconverged({0: good})  # all converged: silent


def test_a_layer_with_no_step_is_unsettled_and_says_so():
    monitor = LayerMonitor(4, KLConstraint(0.1), CRITERION)
    assert monitor.status() == "unsettled"
    assert "not trained" in monitor.advice()


@pytest.mark.parametrize("field, value", [("window", 0), ("patience", 1.5), ("tol_kept", -0.1)])
def test_bad_criterion_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"convergence.{field}"):
        Convergence(**{field: value})


def _feed_closure(monitor, windows, kl, kept, lam, closure):
    for _ in range(windows):
        for _ in range(CRITERION.window):
            monitor.record(kl, kept, lam, closure if monitor.measures_closure() else None)


def test_all_open_is_needed_when_closing_the_least_needed_positions_breaks_the_constraint():
    monitor = LayerMonitor(0, KLConstraint(0.1), CRITERION)
    assert not monitor.measures_closure()  # nothing measured before a window has closed
    _feed_closure(monitor, 4, kl=0.09, kept=0.99, lam=0.5, closure=0.4)
    assert monitor.windows[0].closure is None and monitor.windows[-1].closure == pytest.approx(0.4)
    assert monitor.status() == "needed"
    assert monitor.report()["converged"] and monitor.report()["status"] == "needed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unconverged({0: monitor})  # a verdict: no warning


def test_all_open_is_stuck_open_when_the_closure_keeps_the_constraint():
    monitor = LayerMonitor(0, KLConstraint(0.1), CRITERION)
    _feed_closure(monitor, 4, kl=0.02, kept=0.99, lam=0.5, closure=0.05)
    assert monitor.status() == "open" and not monitor.report()["converged"]
    assert "stuck open" in monitor.advice() and "KL 0.0500" in monitor.advice()


def test_needed_takes_needed_windows_of_all_open_gates():
    """Before, the probe's ranking may be untrained, and closing its "least
    needed" positions closes random ones."""
    criterion = Convergence(window=10, patience=2, needed_windows=8)
    monitor = LayerMonitor(0, KLConstraint(0.1), criterion)
    _feed_closure(monitor, 7, kl=0.0, kept=0.99, lam=0.01, closure=0.4)
    assert monitor.status() == "open"
    _feed_closure(monitor, 1, kl=0.0, kept=0.99, lam=0.01, closure=0.4)
    assert monitor.status() == "needed"  # a slack constraint too: gates saturated open sample no closure


def test_needed_waits_for_the_layer_to_settle():
    monitor = LayerMonitor(0, KLConstraint(0.1), CRITERION)
    _feed_closure(monitor, 2, kl=0.09, kept=0.99, lam=0.5, closure=0.4)
    assert monitor.status() == "open"  # two windows: not settled yet
    assert "looks to need every position" in monitor.advice()
    # a layer that is not all open does not measure the closure
    partly = LayerMonitor(1, KLConstraint(0.1), CRITERION)
    _feed_closure(partly, 2, kl=0.09, kept=0.5, lam=1.0, closure=0.4)
    assert not partly.measures_closure() and partly.windows[-1].closure is None


def test_the_batches_noise_is_not_taken_for_a_trend_but_a_drift_is():
    import random

    criterion = Convergence(window=100, patience=3)
    rng = random.Random(0)

    def feed(monitor, drift):
        for i in range(400):
            monitor.record(0.05, 0.5 + drift * (i // 100) + rng.gauss(0.0, 0.1), 2.0 + rng.gauss(0.0, 1.0))

    steady, strict, drifting = (LayerMonitor(0, KLConstraint(0.1), c) for c in (criterion, Convergence(noise=0.0), criterion))
    feed(steady, 0.0)
    feed(strict, 0.0)
    feed(drifting, 0.03)  # 0.03 a window: well beyond the 0.01 and two standard errors (~0.028)
    assert steady.status() == "converged"
    assert strict.status() == "unsettled"  # the means alone differ by more than 0.01 with this noise
    assert drifting.status() == "unsettled"


def test_the_constraint_is_judged_on_the_settled_span_not_one_window():
    monitor = LayerMonitor(0, KLConstraint(0.1), CRITERION)
    _feed(monitor, 3, kl=0.1, kept=0.4, lam=1.0)
    _feed(monitor, 1, kl=0.14, kept=0.4, lam=1.0)  # one costly window (1.4 eps); the span's mean 1.1 eps
    assert monitor.status() == "converged"
    _feed(monitor, 2, kl=0.14, kept=0.4, lam=1.0)  # the span is now mostly above: 1.3 eps
    assert monitor.status() == "violated"


def test_the_least_multiplier_tolerance_is_where_the_verdict_turns():
    lams = [10.0, 10.0, 12.0]  # the last window 2 above: 2 / 12 of the larger multiplier

    def monitor(tol_lambda):
        criterion = Convergence(window=10, patience=2, tol_lambda=tol_lambda)
        layer = LayerMonitor(0, KLConstraint(0.1), criterion)
        _feed(layer, 3, kl=0.09, kept=0.4, lam=lambda i: lams[i])
        return layer

    least = least_tol_lambda(monitor(0.5).windows, CRITERION)
    assert least == pytest.approx(2.0 / 12.0)  # constant within each window: no noise allowance
    assert monitor(least * 1.01).status() == "converged" and monitor(least * 0.99).status() == "unsettled"
    assert least_tol_lambda(monitor(0.5).windows[:2], CRITERION) is None  # fewer than patience + 1
    small = LayerMonitor(0, KLConstraint(0.1), CRITERION)
    _feed(small, 3, kl=0.09, kept=0.4, lam=lambda i: [0.5, 0.5, 1.5][i])
    assert least_tol_lambda(small.windows, CRITERION) == pytest.approx(1.0 / CRITERION.lambda_floor)
