"""The tracr component study's pieces: the ROC AUC, the inputs, the table."""

import numpy as np
import pytest
import torch

from benchmarks.studies.tracr_components import roc_auc, summary


def test_roc_auc_is_the_chance_a_used_component_scores_above_an_unused_one():
    truth = np.array([True, False, True, False, False])
    assert roc_auc(np.array([0.9, 0.1, 0.8, 0.2, 0.3]), truth) == 1.0
    assert roc_auc(np.array([0.1, 0.9, 0.2, 0.8, 0.7]), truth) == 0.0
    assert roc_auc(np.ones(5), truth) == 0.5  # ties count half
    # against the definition, pair by pair, on random scores with ties
    rng = np.random.default_rng(0)
    scores, labels = rng.integers(0, 4, size=40).astype(float), rng.random(40) < 0.3
    pairs = [(p > n) + 0.5 * (p == n) for p in scores[labels] for n in scores[~labels]]
    assert roc_auc(scores, labels) == pytest.approx(np.mean(pairs))
    assert np.isnan(roc_auc(np.ones(3), np.ones(3, dtype=bool)))


def test_the_inputs_start_with_bos_and_pad_the_rest():
    pytest.importorskip("tracr")
    from benchmarks.studies.tracr_components import random_inputs
    from benchmarks.tasks.tracr_models import compile_program, convert

    model = convert(compile_program("reverse"))
    ids, mask = random_inputs(model, "reverse", 20, seed=0)
    assert ids.shape == (20, 5) and (ids[:, 0] == model.vocabulary["BOS"]).all()
    assert (mask.sum(1) >= 2).all() and torch.equal(ids[mask == 0], torch.full_like(ids[mask == 0], model.vocabulary["compiler_pad"]))
    assert torch.equal(random_inputs(model, "reverse", 20, seed=0)[0], ids)


def test_the_table_has_a_row_per_line_and_dashes_where_a_method_has_no_mask():
    lines = [{"program": "sort", "kind": "heads", "used": 2, "components": 3, "method": "DiffMask", "auc": 0.9,
              "auc_min": 0.5, "verdicts": {"1": "closed"}, "kept_kl": 0.01, "kept_share": 0.6, "fit_seconds": 12.0,
              "attribute_seconds": 0.001},
             {"program": "sort", "kind": "heads", "used": 2, "components": 3, "method": "attribution patching",
              "auc": 1.0, "auc_min": 1.0, "attribute_seconds": 0.002}]
    rows = summary(lines).splitlines()
    assert len(rows) == 4 and "| 0.900 (0.500) | 1: closed | 0.010 | 0.60 | 12 | 1000 | - |" in rows[2]
    assert rows[3].endswith("| - | - | - | - | 2000 | - |")


def test_the_report_says_what_was_measured(tmp_path):
    from benchmarks.studies.tracr_components import report

    line = {"program": "sort", "kind": "units", "used": 32, "components": 60, "method": "attribution patching",
            "auc": 0.64, "auc_min": 0.55, "attribute_seconds": 0.0001}
    text = report([line], tmp_path / "t.jsonl")
    assert text.startswith("# Component masks against tracr's ground truth") and "`sort`:" in text
    assert "| sort | units | 32 / 60 | attribution patching | 0.640 (0.550) |" in text
