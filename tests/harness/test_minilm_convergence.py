"""The MiniLM suites' convergence tables: the least multiplier tolerance each
first verdict needed, read from a fit's state, and the tolerance section that
counts certified probes by it."""

import pytest

from benchmarks.common.minilm.convergence import (constraint_binding_section, first_verdict_tolerances,
                                                  multiplier_tolerance_section)
from captum_diffmask import Convergence


def _window(lam):
    return {"kl": 0.01, "kept": 0.5, "lam": lam, "steps": 100, "closure": None, "kept_sd": 0.0, "lam_sd": 0.0}


def _state(step, cooling_from, **lams):
    return {"state": {"step": step, "cooling_from": cooling_from},
            "monitors": {int(k[1:]): {"windows": [_window(lam) for lam in v]} for k, v in lams.items()}}


def test_the_first_verdicts_windows_are_those_before_the_cool_down():
    criterion = Convergence(patience=2, cooldown=300)
    # layer 0 settled on 10, 10, 12 and was frozen; layer 1 ended the plateau on 4, 4, 4.5; then 3 windows cooled
    saved = _state(800, 500, l0=[3.0, 10.0, 10.0, 12.0, 30.0, 30.0, 30.0],
                   l1=[9.0, 4.0, 4.0, 4.5, 4.5, 9.0, 9.0, 9.0])
    needed = first_verdict_tolerances(saved, criterion)
    assert needed["0"] == pytest.approx(2.0 / 12.0)  # not the cool-down's windows (no move there)
    assert needed["1"] == pytest.approx(0.5 / 4.5)
    assert first_verdict_tolerances(_state(500, None, l0=[1.0, 1.0, 1.0]), criterion) is None  # no cool-down reached
    short = first_verdict_tolerances(_state(500, 200, l0=[2.0, 2.0, 2.0, 2.0, 2.0]), criterion)
    assert short == {"0": None}  # two windows before the cool-down: fewer than patience + 1


def test_the_section_counts_the_certified_probes_by_band():
    runs = [{"seed": 0, "tol_lambda_needed": {"0": 0.03, "1": 0.3, "2": 0.08, "3": None},
             "certificate": {"layers": {"0": {"counted": True}, "1": {"counted": False}, "2": {"counted": False},
                                        "3": {"counted": True}}}},
            {"seed": 1, "tol_lambda_needed": {"0": 0.02}, "certificate": None},
            {"seed": 2, "tol_lambda_needed": None, "certificate": {"layers": {"0": {"counted": True}}}}]
    text = "\n".join(multiplier_tolerance_section({"input": {"runs": runs}, "hidden": {"runs": []}}))
    assert "| <= 5% | 1 | 1 |" in text  # layer 0 of seed 0; seed 1 has no certificate, seed 2 no state
    assert "| <= 10% | 1 | 0 |" in text and "| <= 50% | 1 | 0 |" in text
    assert "<= 20%" not in text  # an empty band is left out, and so is a layer with too few windows
    assert "at most 50% of max(lambda" in text  # the criterion's default, without options
    assert multiplier_tolerance_section({"input": {"runs": []}, "hidden": {"runs": []}}) == []


def test_the_section_reads_the_fits_own_tolerance():
    certified = {"layers": {"0": {"counted": True}, "1": {"counted": False}, "2": {"counted": True}}}
    runs = [{"seed": 0, "options": {"convergence": {"cooldown": 500, "tol_lambda": 0.2}},
             "tol_lambda_needed": {"0": 0.15, "1": 0.3, "2": 0.2}, "certificate": certified}]
    text = "\n".join(multiplier_tolerance_section({"input": {"runs": []}, "hidden": {"runs": runs}}))
    assert "at most 20% of max(lambda" in text
    assert "| <= 20% | 2 | 2 |" in text  # 0.15 and 0.2: within the fits' tolerance
    assert "| > 20% | 1 | 0 |" in text  # a layer the budget's cool-down began on unsettled
    assert "50%" not in text


def test_the_binding_section_bands_the_certified_probes_by_the_constraints_place():
    def layer(kls, lam):
        return {"windows": [{"kl": kl, "lam": lam, "steps": 100} for kl in kls]}

    def cert(before, after, counted):
        return {"masked_before": before, "masked_after": after, "counted": counted}

    run = {"options": {"eps": 0.01},
           "convergence": {"0": layer([0.006, 0.008], 9.0), "1": layer([0.0095, 0.0097], 12.0),
                           "2": layer([0.012, 0.012], 5.0), "3": layer([0.0, 0.0], 0.1), "4": layer([0.005], 9.0)},
           "certificate": {"layers": {"0": cert(0.2, 0.23, False), "1": cert(0.3, 0.302, True),
                                      "2": cert(0.4, 0.39, True), "3": cert(0.9, 0.9, True)}}}
    text = "\n".join(constraint_binding_section({"input": {"runs": [run]}, "hidden": {"runs": []}}))
    assert "| < 0.8 | 1 | +0.0300 | 0 |" in text  # 0.7 of eps, the multiplier 9: not at a KKT point
    assert "| 0.9 to 1 | 1 | +0.0020 | 1 |" in text and "| >= 1.1 | 1 | -0.0100 | 1 |" in text
    assert "| multiplier <= 2 | 1 | +0.0000 | 1 |" in text  # layer 4 has no certificate: left out
    assert "0.8 to 0.9" not in text
    assert constraint_binding_section({"input": {"runs": [{**run, "certificate": None}]}, "hidden": {"runs": []}}) == []
