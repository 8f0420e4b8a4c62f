"""Erasure agreement scores (captum_diffmask.evaluation.erasure_agreement) on hand-made cases,
and against a brute-force reading of their definitions."""

import itertools
import math

import pytest
import torch

from captum_diffmask.evaluation.erasure_agreement import (
    agreement, agreement_per_example, closest_optimal_set, kept_share, keeps_prediction, optimality, set_scores,
    summarize_agreement, top_k_mask,
)


def b(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_set_scores_hand_made():
    kept = b([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    ref = b([[1, 0, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1]])
    s = set_scores(kept, ref)
    # row 0: overlap 1, |kept| 2, |ref| 2 -> P = R = F1 = 1/2
    # row 1: overlap 1, |kept| 3, |ref| 1 -> P 1/3, R 1, F1 = 2 * (1/3) / (4/3) = 1/2
    # row 2: no overlap -> all 0
    torch.testing.assert_close(s["precision"], torch.tensor([0.5, 1 / 3, 0.0]))
    torch.testing.assert_close(s["recall"], torch.tensor([0.5, 1.0, 0.0]))
    torch.testing.assert_close(s["f1"], torch.tensor([0.5, 0.5, 0.0]))
    assert s["overlap"].tolist() == [1, 1, 0]


def test_set_scores_empty_set_conventions():
    kept = b([[0, 0, 0], [0, 0, 0], [1, 0, 0]])
    ref = b([[0, 0, 0], [0, 1, 0], [0, 0, 0]])
    s = set_scores(kept, ref)
    # both empty: perfect; kept empty only: nothing found; optimum empty only: P 0, R 1, F1 0
    assert s["precision"].tolist() == [1.0, 0.0, 0.0]
    assert s["recall"].tolist() == [1.0, 0.0, 1.0]
    assert s["f1"].tolist() == [1.0, 0.0, 0.0]


def test_closest_optimal_set_picks_largest_overlap_first_on_ties():
    kept = b([[1, 1, 0, 0, 0], [0, 0, 0, 0, 1]])
    sets = [
        b([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0], [1, 1, 0, 0, 0]]),  # the third matches exactly
        b([[1, 0, 0, 0, 0], [0, 1, 0, 0, 0]]),  # no overlap with either: the first one
    ]
    closest, index = closest_optimal_set(kept, sets)
    assert index.tolist() == [2, 0]
    assert closest[0].tolist() == [True, True, False, False, False]
    assert closest[1].tolist() == [True, False, False, False, False]


def test_closest_optimal_set_agrees_with_brute_force():
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        length = 7
        kept = torch.rand(1, length, generator=generator) < 0.4
        size = int(torch.randint(1, 4, (1,), generator=generator))
        combos = list(itertools.combinations(range(length), size))
        chosen = torch.randperm(len(combos), generator=generator)[:4].tolist()
        sets = torch.zeros(len(chosen), length, dtype=torch.bool)
        for row, c in enumerate(chosen):
            sets[row, list(combos[c])] = True
        result = agreement(kept, [sets])
        # brute force: the best F1 over the sets, from the definitions
        best = -1.0
        for row in sets:
            overlap = int((row & kept[0]).sum())
            p = overlap / int(kept.sum()) if kept.any() else 0.0
            r = overlap / size
            f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
            best = max(best, f1)
        assert math.isclose(float(result["f1"][0]), best, rel_tol=1e-6, abs_tol=1e-7)
        assert int(result["optimal_size"][0]) == size


def test_closest_optimal_set_rejects_unsolved_and_bad_shapes():
    kept = b([[1, 0, 0]])
    with pytest.raises(ValueError, match="no optimal set"):
        closest_optimal_set(kept, [torch.zeros(0, 3)])
    with pytest.raises(ValueError, match="one tensor per example"):
        closest_optimal_set(kept, [])
    with pytest.raises(ValueError, match="3 columns"):
        closest_optimal_set(kept, [torch.ones(1, 4)])


def test_top_k_mask_ties_padding_and_clipping():
    scores = torch.tensor([[0.1, 0.5, 0.5, 0.9, 7.0], [3.0, 2.0, 1.0, 0.0, -1.0]])
    mask = b([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    kept = top_k_mask(scores, torch.tensor([2, 5]), mask)
    # padding never kept (its 7.0 is ignored); the tie at 0.5 goes to the earlier word
    assert kept[0].tolist() == [False, True, False, True, False]
    # k larger than the number of real words: every real word
    assert kept[1].tolist() == [True, True, True, False, False]
    assert top_k_mask(scores, 0, mask).sum() == 0
    nan_scores = torch.tensor([[float("nan"), 1.0, 2.0]])
    assert top_k_mask(nan_scores, 2).tolist() == [[False, True, True]]
    with pytest.raises(ValueError, match="k must"):
        top_k_mask(scores, torch.tensor([1, 2, 3]), mask)


def test_optimality_keeps_prediction_and_kept_share():
    kept = b([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    original = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    masked = torch.tensor([[1.0, 0.5], [0.0, 2.0], [0.0, 1.0]])
    kept_prediction = keeps_prediction(original, masked)
    assert kept_prediction.tolist() == [True, True, False]
    # row 0: right size and prediction kept; row 1: one word too many; row 2: prediction lost
    assert optimality(kept, kept_prediction, torch.tensor([1, 1, 1])).tolist() == [True, False, False]
    mask = b([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    torch.testing.assert_close(kept_share(kept, mask), torch.tensor([0.25, 1.0, 0.25]))
    with pytest.raises(ValueError, match="shape"):
        keeps_prediction(original, masked[:2])


def test_agreement_per_example_hand_made():
    kept = b([[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    sets = [b([[1, 0, 0, 0], [0, 0, 1, 0]]), b([[0, 1, 0, 0]]), b([[0, 0, 1, 0]])]
    scores = agreement_per_example(kept, sets, torch.tensor([True, True, False]), b([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]]))
    # row 0: closest {0}, 2 kept for an optimum of 1; row 1: exact; row 2: nothing kept, the class flips
    torch.testing.assert_close(scores["f1"], torch.tensor([2 / 3, 1.0, 0.0]))
    assert scores["optimality"].tolist() == [0.0, 1.0, 0.0] and scores["sufficiency"].tolist() == [1.0, 1.0, 0.0]
    assert scores["kept_size"].tolist() == [2, 1, 0] and scores["optimal_size"].tolist() == [1, 1, 1]
    torch.testing.assert_close(scores["l0"], torch.tensor([0.5, 1 / 3, 0.0]))
    summary = summarize_agreement(scores)
    for key in ("precision", "recall", "f1", "optimality", "sufficiency", "l0", "optimal_l0"):
        assert summary[key] == pytest.approx(100 * float(scores[key].mean()))  # the summary is their mean


def test_summarize_agreement_means_in_percent():
    kept = b([[1, 1, 0, 0], [0, 1, 0, 0]])
    sets = [b([[1, 0, 0, 0], [0, 0, 1, 0]]), b([[0, 1, 0, 0]])]
    summary = summarize_agreement(agreement_per_example(kept, sets, torch.tensor([True, True]), b([[1, 1, 1, 1], [1, 1, 1, 0]])))
    # row 0: closest {0}: P 1/2, R 1, F1 2/3; row 1: exact: 1, 1, 1
    assert summary["precision"] == pytest.approx(75.0)
    assert summary["recall"] == pytest.approx(100.0)
    assert summary["f1"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert summary["optimality"] == pytest.approx(50.0)  # row 0 keeps 2 words, the optimum is 1
    assert summary["sufficiency"] == pytest.approx(100.0)
    assert summary["l0"] == pytest.approx(100 * (2 / 4 + 1 / 3) / 2)
    assert summary["optimal_l0"] == pytest.approx(100 * (1 / 4 + 1 / 3) / 2)
    assert summary["count"] == 2
    # kept words at padding do not count
    padded = summarize_agreement(agreement_per_example(b([[1, 0, 0, 1]]), [b([[1, 0, 0, 0]])], torch.tensor([True]), b([[1, 1, 1, 0]])))
    assert padded["f1"] == pytest.approx(100.0) and padded["optimality"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="per_example lacks"):
        summarize_agreement({"f1": torch.ones(2)})
