"""The development programs' study: a row per variant, and its report."""

import pytest

from benchmarks.studies import components_dev
from benchmarks.tasks.tracr_models import DEVELOPMENT_PROGRAMS, PROGRAMS


def test_the_development_programs_are_never_the_reported_ones():
    from benchmarks.suites.components.settings import DEFAULTS

    assert set(DEVELOPMENT_PROGRAMS) <= set(PROGRAMS)
    assert not set(DEVELOPMENT_PROGRAMS) & set(DEFAULTS["tracr"]["programs"])


def test_a_capped_study_scores_each_variant_and_writes_its_table():
    pytest.importorskip("tracr")
    variants = {"floor": {"l0_floor": 0.05}, "floor, lr 1e-3": {"l0_floor": 0.05, "lr": 1e-3}}
    rows = components_dev.score("sort_freq_asc", "heads", variants, max_steps=10)
    assert [r["variant"] for r in rows] == ["floor", "floor, lr 1e-3"]
    for row in rows:
        assert row["used"] == 3 and row["components"] == 4 and 0.0 <= row["auc"] <= 1.0
        assert row["kept_kl"] >= 0.0 and set(row["verdicts"]) == {1, 2, 3, 4}
    text = components_dev.markdown(rows, "the command")
    assert "| sort_freq_asc | heads | 3 / 4 | floor |" in text and "- floor, lr 1e-3: mean ROC AUC" in text
