"""The activity-following score against tracr's used components: a reference line."""

import pytest

from benchmarks.studies import component_activity


def test_the_line_is_one_where_every_used_component_is_active_and_below_where_some_are_idle():
    pytest.importorskip("tracr")
    heads = component_activity.activity_line("sort", "heads", [0], inputs=8)
    units = component_activity.activity_line("sort", "units", [0], inputs=8)
    assert heads[0]["active_share"] == 1.0 and heads[0]["auc"] == 1.0  # both used heads act on every input
    row = units[0]
    assert row["used"] == 32 and 0.0 < row["active_share"] < 1.0
    # idle used units tie with the unused ones at 0: half credit for those pairs
    share = row["active_share"]
    assert row["auc"] == pytest.approx(share + (1 - share) / 2, abs=1e-9)
    text = component_activity.markdown(heads + units, "the command")
    assert "| sort | units | 0 | 32 / 60 |" in text and "Command: `the command`" in text
