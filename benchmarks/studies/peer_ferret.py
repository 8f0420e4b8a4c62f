r"""ferret's side of the agreement check (:mod:`benchmarks.studies.peer_agreement`).

Runs in an environment of its own (ferret-xai 0.4.2 pins captum 0.7 and
transformers 4.x, below this project's), imports nothing from this repository,
and reads what our side saved in a folder: the models (``save_pretrained``), the
tokenizer's ``vocab.txt``, and ``inputs.json`` (per model: texts, per-token
scores with [CLS] and [SEP] at the ends, targets; the fractions). It writes ``theirs.json``: per
sentence and fraction, ferret's comprehensiveness and sufficiency (each fraction
alone, so that the per-fraction values are compared and not only their mean),
and ferret's AOPC over all fractions, with the tokens replaced by [MASK]
(``remove_tokens=False``) and deleted (``remove_tokens=True``, ferret's default).

Usage: ``PEER_PYTHON benchmarks/studies/peer_ferret.py FOLDER``.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List


def _evaluate(evaluator: Any, explanation: Any, target: int, fractions: List[float], remove: bool) -> Dict[str, Any]:
    args = {"remove_first_last": True, "only_pos": True}
    per_fraction = []
    for fraction in fractions:
        removal = {"remove_tokens": remove, "based_on": "perc", "thresholds": [fraction]}
        per_fraction.append(float(evaluator.compute_evaluation(explanation, target, removal_args=removal,
                                                               **args).score))
    removal = {"remove_tokens": remove, "based_on": "perc", "thresholds": fractions}
    aopc = float(evaluator.compute_evaluation(explanation, target, removal_args=removal, **args).score)
    return {"per_fraction": per_fraction, "aopc": aopc}


def main(folder: Path) -> None:
    import numpy as np
    import torch
    from ferret.evaluators.faithfulness_measures import AOPC_Comprehensiveness_Evaluation, AOPC_Sufficiency_Evaluation
    from ferret.explainers.explanation import Explanation
    from transformers import AutoModelForSequenceClassification, BertTokenizerFast

    torch.set_num_threads(1)
    inputs = json.loads((folder / "inputs.json").read_text())
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    fractions = [float(f) for f in inputs["fractions"]]
    results: Dict[str, Any] = {"cases": {}}
    for name, case in inputs["cases"].items():
        model = AutoModelForSequenceClassification.from_pretrained(folder / case["model_dir"]).eval()
        evaluators = {"comprehensiveness": AOPC_Comprehensiveness_Evaluation(model, tokenizer),
                      "sufficiency": AOPC_Sufficiency_Evaluation(model, tokenizer)}
        rows = []
        for text, tokens, scores, target in zip(case["texts"], case["tokens"], case["scores"], case["targets"]):
            explanation = Explanation(text, tokens, np.array(scores), "ours", target)
            row: Dict[str, Any] = {}
            for removal, remove in (("mask", False), ("delete", True)):
                for metric, evaluator in evaluators.items():
                    row[f"{metric}_{removal}"] = _evaluate(evaluator, explanation, target, fractions, remove)
            rows.append(row)
        results["cases"][name] = rows
    results["versions"] = {name: metadata.version(name) for name in ("ferret-xai", "transformers", "captum", "torch")}
    (folder / "theirs.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
