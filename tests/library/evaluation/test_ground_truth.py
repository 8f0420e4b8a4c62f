"""Scores against a ground truth: the summary the paper reports."""

import math

import pytest
import torch

from captum_diffmask.evaluation.ground_truth import summarize


def test_summarize_leaves_out_nan_and_reports_inf():
    stats = summarize(torch.tensor([0.1, 0.3, math.nan]))
    assert stats["count"] == 2 and stats["mean"] == pytest.approx(0.2) and stats["std"] == pytest.approx(0.1)
    stats = summarize(torch.tensor([0.5, math.inf, math.nan, 1.5]))
    assert stats["mean"] == math.inf and stats["finite_mean"] == pytest.approx(1.0)
    assert stats["inf_share"] == pytest.approx(1 / 3) and stats["count"] == 3
    assert math.isnan(summarize(torch.tensor([math.nan]))["mean"])
