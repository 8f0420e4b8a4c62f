"""The faithfulness suite on a tiny run (a config-built tiny BERT on a few dozen
SST sentences), and its pieces on hand-made inputs."""

import json
import math

import pytest
import torch

from benchmarks import runner
from benchmarks.suites import faithfulness as suite
from benchmarks.suites.faithfulness.export import prediction
from benchmarks.tasks.sst import SSTSentence
from benchmarks.tasks.sst_bert import EncodedSST
from tiny_models import needs_sst

TINY = {
    "seeds": [0, 1],
    "train_sentences": 96,
    "eval_sentences": 20,
    "model": {"source": "tiny", "epochs": 2, "batch_size": 16, "lr": 1e-3},
    # a certificate of a few steps, as the sst suite's tiny run (its 500 would be 90 % of this test)
    "diffmask": {"epochs": 2, "batch_size": 16, "validation_sentences": 24,
                 "certificate": {"steps": 5, "closure_examples": 2}},
    "method_options": {"IntegratedGradients": {"n_steps": 4},
                       "PerSampleBottleneck": {"steps": 3, "max_batches": 2, "batch_size": 16},
                       "ReadoutBottleneck": {"max_steps": 3, "batch_size": 16}, "Guan": {"steps": 3}},
    "fractions": [0.2, 0.5],
    "cache": False,
}


def _encoded():
    # [CLS] good film ##making [SEP] <pad>: words "good" (label 4) and "filmmaking" (label 2)
    sentence = SSTSentence(("good", "filmmaking"), 3, (4, 2))
    word_index = torch.tensor([[-1, 0, 1, 1, -1, -1]])
    ids = torch.tensor([[1, 5, 6, 7, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    return EncodedSST(ids, mask, torch.tensor([3]), word_index, [sentence])


def test_rationales_mark_the_pieces_of_labelled_words_only():
    data = _encoded()
    masks = suite.rationale_masks(data)
    assert masks["non-neutral"].tolist() == [[False, True, False, False, False, False]]
    assert masks["strong"].tolist() == [[False, True, False, False, False, False]]
    assert suite.word_tokens(data).tolist() == [[False, True, True, True, False, False]]


def test_eraser_prediction_scores_words_by_their_best_piece():
    record = prediction(0, _encoded(), torch.tensor([0.9, 0.1, 0.3, 0.7, 0.0]))
    rationale = record["rationales"][0]
    assert rationale["soft_rationale_predictions"] == pytest.approx([0.1, 0.7])
    assert rationale["hard_rationale_predictions"] == [{"start_token": 1, "end_token": 2}]


def test_verdicts_table_counts_settled_probes_within_the_held_out_bound_that_the_certificate_counts():
    from benchmarks.suites.faithfulness.report import _verdicts_table

    fits = [{"seed": 0, "eps": 0.02, "convergence": {"0": "converged", "1": "unsettled"},
             "heldout": {"0": {"kl": 0.024}, "1": {"kl": 0.01}}},
            {"seed": 1, "eps": 0.02, "convergence": {"0": "converged", "1": "needed"},
             "heldout": {"0": {"kl": 0.026}, "1": {"kl": 0.01}}}]
    text = "\n".join(_verdicts_table(fits))  # fits without a certificate: settled and within the bound
    assert ("| DiffMask layer 0 | seed 0: converged, held-out KL 0.0240; seed 1: converged, held-out KL 0.0260 (over) "
            "| 1 of 2 |") in text
    assert "| DiffMask layer 1 | seed 0: unsettled, held-out KL 0.0100; seed 1: needed, held-out KL 0.0100 | 1 of 2 |" in text
    fits[0]["certificate"] = {"layers": {"0": {"counted": False}, "1": {"counted": False}}}
    fits[1]["certificate"] = {"layers": {"0": {"counted": True}, "1": {"counted": True}}}
    text = "\n".join(_verdicts_table(fits))
    assert ("| DiffMask layer 0 | seed 0: converged, not certified, held-out KL 0.0240; seed 1: converged, certified, "
            "held-out KL 0.0260 (over) | 0 of 2 |") in text
    assert "seed 1: needed, certified, held-out KL 0.0100 | 1 of 2 |" in text
    assert "convergence certificate" in text and _verdicts_table([]) == []


def test_across_seeds_gives_mean_and_sample_std():
    result = suite.across_seeds([{"a": 1.0, "c": [1.0, 2.0]}, {"a": 3.0, "c": [3.0, 4.0]}])
    assert result["a"] == 2.0 and result["a_std"] == pytest.approx(math.sqrt(2.0))
    assert result["c"] == [2.0, 3.0] and result["seeds"] == 2


@needs_sst
def test_tiny_run_is_complete_and_writes_the_report_and_export(tmp_path):
    results = runner.run_suite("faithfulness", tmp_path, overrides=TINY, verbose=False)
    L = results["model"]["layers"]
    assert not results["failures"], results["failures"]
    for removal in ("baseline", "attention"):
        metrics = results["metrics"][removal]
        expected = {f"DiffMask layer {k}" for k in range(L + 1)} | {"DiffMask mean"} | set(suite.METHODS)
        assert set(metrics) == expected
        for record in metrics.values():
            assert len(record["comprehensiveness"]) == 2 and -1 <= record["aopc_comprehensiveness"] <= 1
            assert record["aopc_sufficiency"] == pytest.approx(sum(record["sufficiency"]) / 2)
    own = results["metrics"]["own baseline"]
    assert set(own) == {f"DiffMask layer {k}" for k in range(L + 1)}
    for name, record in own.items():
        assert record["seeds"] == 2 and record["aopc_sufficiency"] == pytest.approx(sum(record["sufficiency"]) / 2)
    # the learned baselines are not [MASK]'s embedding: the same scores read otherwise
    assert any(own[n]["sufficiency"] != results["metrics"]["baseline"][n]["sufficiency"] for n in own)
    baseline = results["metrics"]["baseline"]
    assert baseline["DiffMask mean"]["seeds"] == 2 and baseline["Random"]["seeds"] == 2
    assert baseline["Occlusion"]["seeds"] == 1 and results["metrics"]["attention"]["Random"]["seeds"] == 1
    assert 0 <= baseline["Random"]["auprc/non-neutral"] <= 1
    report = (tmp_path / "report.md").read_text()
    for heading in ("ERASER's metrics, tokens removed by `baseline`", "`attention`", "Plausibility",
                    "Where DiffMask stands", "DiffMask with its own baseline as the removal", "Speed", "Export",
                    "probes that count"):
        assert heading in report
    # the sst suite's fits: no checkpoint selected, the read-out scored on held-out train sentences
    assert all(sorted(fit["heldout"]) == [str(k) for k in range(L + 1)] for fit in results["diffmask_fits"])
    assert (tmp_path / results["figures"]["curves"]).stat().st_size > 1000
    lines = (tmp_path / "eraser" / "annotations.jsonl").read_text().splitlines()
    assert len(lines) == results["model"]["evaluated_sentences"] == results["export"]["lines"]
    assert json.loads((tmp_path / "results.json").read_text())["suite"] == "faithfulness"
    first = json.loads((tmp_path / "eraser" / "DiffMask_mean.jsonl").read_text().splitlines()[0])
    assert first["annotation_id"] == json.loads(lines[0])["annotation_id"]
    assert len(first["rationales"][0]["soft_rationale_predictions"]) == len(json.loads(lines[0])["tokens"])
