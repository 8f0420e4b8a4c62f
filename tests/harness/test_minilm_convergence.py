"""The MiniLM suites' convergence tables: the multiplier's last move and the
tolerance section that counts certified probes by it."""

import pytest

from benchmarks.common.minilm.convergence import multiplier_move, multiplier_tolerance_section


def _report(status, *lams):
    return {"status": status, "steps": 100 * len(lams), "windows": [{"lam": lam, "kept": 0.5, "kl": 0.01} for lam in lams]}


def test_the_move_is_a_share_of_the_multipliers_scale():
    assert multiplier_move(_report("converged", 8.0, 10.0)) == pytest.approx(0.2)
    assert multiplier_move(_report("converged", 0.5, 1.0)) == pytest.approx(0.25)  # below the floor of 2
    assert multiplier_move(_report("converged", 3.0)) is None


def test_the_section_counts_the_certified_converged_probes_by_band():
    runs = [{"seed": 0, "convergence": {"0": _report("converged", 10.0, 10.5), "1": _report("converged", 4.0, 7.0),
                                        "2": _report("unsettled", 4.0, 9.0), "3": _report("converged", 2.0, 6.0)},
             "certificate": {"layers": {"0": {"counted": True}, "1": {"counted": False}, "2": {"counted": False},
                                        "3": {"counted": True}}}},
            {"seed": 1, "convergence": {"0": _report("converged", 10.0, 10.2)}, "certificate": None}]
    text = "\n".join(multiplier_tolerance_section({"input": {"runs": runs}, "hidden": {"runs": []}}))
    assert "| <= 10% | 1 | 1 |" in text  # layer 0 of seed 0; seed 1 has no certificate
    assert "| <= 50% | 1 | 0 |" in text  # a move of 3 / 7
    assert "| > 50% (noise allowance) | 1 | 1 |" in text  # 4 / 6, within the noise allowance
    assert "<= 25%" not in text  # an empty band is left out, and so is the unsettled layer
    assert multiplier_tolerance_section({"input": {"runs": []}, "hidden": {"runs": []}}) == []
