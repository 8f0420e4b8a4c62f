"""The faithfulness suite's settings: the configuration (:data:`DEFAULTS`,
:data:`QUICK`) and the compared methods. The model and DiffMask's fit are the sst
suite's, so the fine-tuned MiniLM comes from its cache."""

from __future__ import annotations

import copy
from typing import Any, Dict

from benchmarks.suites.sst import CHOSEN_ON as SST_CHOSEN_ON, DEFAULTS as SST_DEFAULTS, QUICK as SST_QUICK

DESCRIPTION = (
    "SST-5 with the fine-tuned MiniLM: comprehensiveness, sufficiency and AOPC (ERASER) of every method's "
    "input-token scores, and plausibility against SST's word labels"
)

#: The comparison methods (registry names) plus ``Attention`` (built in here);
#: DiffMask (input mode, every layer and the mean over layers) always runs.
METHODS = ["IntegratedGradients", "Occlusion", "PerSampleBottleneck", "ReadoutBottleneck", "Guan", "Attention", "Random"]

#: What each choice was made on (as the sst suite's :data:`CHOSEN_ON`): the
#: model, DiffMask's fits and the methods' options are the sst suite's.
CHOSEN_ON: Dict[str, Dict[str, str]] = {
    **SST_CHOSEN_ON,
    "fractions and removals": {"on": "rule", "why": "ERASER's AOPC fractions (1, 5, 10, 20, 50 %) and the removals "
                                                    "fixed in advance"},
}

DEFAULTS: Dict[str, Any] = {
    # the sst suite's first two seeds (its DiffMask fits, from the fit cache after its run)
    "seeds": [0, 1],
    "threads": None,
    "data_dir": None,
    "split": "dev",
    "train_sentences": None,  # None: all 8544 (the sst suite's model and DiffMask fits)
    "eval_sentences": 400,  # spread evenly over the split
    "model": copy.deepcopy(SST_DEFAULTS["model"]),
    # the sst suite's DiffMask settings (input mode), so that its fits of seeds 0
    # and 1 are this suite's: with the fit cache (benchmarks/common/minilm/fit_cache.py)
    # a run after the sst suite's loads them instead of fitting again
    "diffmask": {k: copy.deepcopy(v) for k, v in SST_DEFAULTS["diffmask"].items() if k != "hidden"},
    "methods": list(METHODS),
    # the stochastic methods, run once per seed (their std across seeds is reported); the
    # deterministic ones (IG, Occlusion, attention) run once, and so does the Readout
    # Bottleneck, whose network is trained (the first seed's; ~10 min a fit on 2 cores)
    "seeded_methods": ["PerSampleBottleneck", "Guan", "Random"],
    # the sst suite's settings (those of DiffMask's own SST comparison), IG with 20 steps for time
    "method_options": {**copy.deepcopy(SST_DEFAULTS["method_options"]), "IntegratedGradients": {"n_steps": 20}},
    "fractions": [0.01, 0.05, 0.10, 0.20, 0.50],
    # removals scored for every score set; the others for the first seed's only
    "removals": ["baseline", "attention"],
    "all_seeds_removal": "baseline",
    # DiffMask's depths scored again with the removed tokens' embeddings replaced by
    # the depth's own learned baseline (what its gates put in their place), every seed
    "own_baseline": True,
    "batch_size": 64,
    "export_sentences": None,  # None: every evaluated sentence in the ERASER-style JSONL
    "cache": True,
}

QUICK: Dict[str, Any] = {
    "seeds": [0, 1],
    "train_sentences": SST_QUICK["train_sentences"],
    "eval_sentences": 60,
    "model": copy.deepcopy(SST_QUICK["model"]),
    "diffmask": {"epochs": 1, "validation_sentences": 100, "batch_size": 32},
    "method_options": {"IntegratedGradients": {"n_steps": 8}, "PerSampleBottleneck": {"steps": 10, "max_batches": 4},
                       "Guan": {"steps": 10}},
}
