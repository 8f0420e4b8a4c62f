"""The study of the KL against one component's scale: the curves, their shapes, the report."""

import pytest

from benchmarks.studies import component_scales


def test_a_compiled_head_whose_kl_is_flat_then_jumps_is_a_step():
    pytest.importorskip("tracr")
    rows = component_scales.kl_curves("sort_freq_asc", "heads", inputs=16)
    # the used heads only (blocks 1, 3 and 4 of 4), each curve from intact (KL 0) to zero-ablated
    assert [(r["block"], r["index"]) for r in rows] == [(1, 0), (3, 0), (4, 0)]
    for row in rows:
        assert len(row["kls"]) == len(component_scales.SCALES) and row["kls"][0] == pytest.approx(0.0, abs=1e-6)
        assert row["kls"][-1] > 1.0  # every used head is needed alone
    first = rows[0]
    # block 1's head changes nothing down to 0.4 of its output, then the prediction breaks: zero slope near open
    assert max(first["kls"][:6]) < component_scales.FLAT and first["kls"][6] > 1.0 and first["shape"] == "step"
    text = component_scales.markdown({"sort_freq_asc": {"heads": rows}}, "the command")
    assert "| 1 | 0 | 0.000 | 0.000 | 0.000 | 0.000 | 0.000 | 0.000 |" in text and "| step |" in text


def test_units_are_counted_by_shape_per_block():
    rows = [{"block": 1, "index": 0, "kls": [0.0] * 8, "shape": "none"},
            {"block": 1, "index": 3, "kls": [0.0] * 7 + [2.0], "shape": "step"},
            {"block": 2, "index": 1, "kls": [0.0, 0.1] + [1.0] * 6, "shape": "graded"}]
    text = component_scales.markdown({"p": {"units": rows}}, "c")
    assert "| 1 | 1 | 0 | 1 |" in text and "| 2 | 0 | 1 | 0 |" in text
