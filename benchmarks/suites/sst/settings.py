"""The sst suite's settings: the configuration (:data:`DEFAULTS`, :data:`QUICK`),
the compared methods, the paper's numbers and the targets."""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.fit_presets import EVERY_STEP_DEPLOYED_CHOSEN_ON, EVERY_STEP_DEPLOYED_FIT, PAPER_FIT

DESCRIPTION = (
    "SST-5 with a fine-tuned MiniLM: DiffMask input/hidden faithfulness, stability, [CLS] share, "
    "layers kept by sentiment and POS, per-layer heatmaps, speed"
)

#: The comparison methods (registry names) plus ``Attention`` (built in here).
METHODS = ["IntegratedGradients", "Occlusion", "PerSampleBottleneck", "ReadoutBottleneck", "Guan", "Attention", "Random"]
#: The methods whose per-layer heatmaps are drawn beside DiffMask's.
HEATMAP_METHODS = ["IntegratedGradients", "PerSampleBottleneck", "Guan", "Attention"]

DEFAULTS: Dict[str, Any] = {
    # the seeds whose fits train every layer: the faithfulness, the depth profile
    # and the analyses of the attributions read them
    "seeds": [0, 1],
    # the stability across the paper's 5 seeds (both ways, and the swap test) at
    # what 2 CPU cores afford: three more seeds fit the bottom, middle and top
    # layers only (a fit with 7 layers active costs ~4.5 s a step on one thread,
    # ~2.5 h an input fit), and the stability is taken at those layers over all
    # five. None: the stability over ``seeds`` at every layer.
    "stability_seeds": {"seeds": [2, 3, 4], "layers": [0, 3, 6]},
    "threads": None,  # torch's default (every core)
    # DiffMask's fits in this many processes side by side, one torch thread each
    # (1: one after the other in this process, on `threads`)
    "workers": 2,
    "data_dir": None,
    "split": "dev",
    "train_sentences": None,  # None: all 8544
    "eval_sentences": None,  # None: the whole evaluated split
    "model": {
        "source": "minilm",  # "minilm" (the sst extra) or "tiny" (config-built, for tests)
        "num_layers": None,  # keep only the first N blocks (quick runs)
        "epochs": 3, "lr": 5e-5, "batch_size": 32, "warmup": 0.1, "seed": 0, "max_length": 128,
    },
    "diffmask": {
        # The task's settings on top of fit's defaults (not tuned per task):
        # the L0 term as the share of kept positions ("mean", so eps does not
        # depend on sentence length) and a tight eps, because fidelity, not
        # sparsity, is what a loose one lost (docs/reproduction/sst-erasure.md).
        # fit runs until every layer has converged (each frozen once settled),
        # capped at 5 000 steps a layer: the sweeps on train sentences measured
        # fit's defaults with 2 500 (benchmarks/sweeps/sst-per-depth-*-train.json:
        # input mode's depths converged after 500-2 500 steps), and at that cap 7
        # of the 42 probes of the committed run (docs/results/sst.md at commit
        # be9764f) had no verdict, 5 of them still moving within 0.01 of eps
        # (verdicts are the fit's own, on train batches); the cap is not in the
        # fit cache's key, so a fit settled within 2 500 steps is this cap's
        # fit and one that cap stopped goes on from its state. No checkpoint is
        # selected: the fit's last probe is kept, and its deterministic read-out
        # is scored on the 400 train sentences set aside from the fit (each
        # run's ``heldout``; no dev sentence is read by a fit). The model's passes
        # in bfloat16, as in those sweeps (fit's own default is float32).
        # eps 0.01 in both modes (CHOSEN_ON): the sparsest eps whose probe keeps
        # the masked macro-F1 within one point on held-out train sentences.
        "batch_size": 32, "l0": "mean", "eps": 0.01,
        "validation_sentences": 400, "validation_from": "train", "select_checkpoint": False,
        "max_steps": 5000, "precision": "bfloat16",
        # every probe trained 500 steps further with nothing frozen, its drift
        # measured on the held-out train sentences (captum_diffmask.certify)
        "certificate": {"steps": 500},
        # once every layer has its verdict (or at the criterion's budget, 4 000
        # steps a layer, at the latest), at least 500 more steps at every layer
        # at a tenth of the rates, and on until the verdicts hold again on
        # them: at the fit's rates the certificate going on from a settled
        # probe's own state counts 2 of its 7 depths, after the cool-down 6 of
        # 7 (docs/results/certificate-noise.md): at those rates it would
        # measure the optimiser's noise. The multiplier's tolerance is fit's
        # (50 % of its scale per window; CHOSEN_ON: 20 % counted no more probes)
        "convergence": {"cooldown": 500},
        # fit's defaults of the committed report (fit_presets.EVERY_STEP_DEPLOYED_FIT)
        **EVERY_STEP_DEPLOYED_FIT,
        "input": {}, "hidden": {},
    },
    # The paper's own recipe as a reference row (its sentiment appendix: Lookahead
    # RMSprop at lr 3e-4, the multiplier at 0.1, one layer drawn per batch, batch
    # 64, KL < 0.5, 100 epochs; the authors' tied input votes and sum L0), for as
    # many epochs as the CPU budget allows; its fits replace the suite's settings
    # (model, sentences and held-out scoring stay the suite's). None: left out.
    "paper_recipe": {
        "seeds": [0], "epochs": 10,
        "diffmask": {**PAPER_FIT, "eps": 0.5, "batch_size": 64, "l0": "expected",
                     "select_checkpoint": False, "precision": "bfloat16", "input": {"votes": "tied"}, "hidden": {}},
    },
    "methods": list(METHODS),
    "method_options": {
        # the settings of DiffMask's own SST comparison (algorithms.md 1.10):
        # IG 50 steps; bottleneck and Guan 50 steps of centred RMSprop at lr 0.1,
        # Guan's lam 0.1; Guan read out as 1/sigma (higher = more important)
        "IntegratedGradients": {"n_steps": 50},
        "Occlusion": {},
        "PerSampleBottleneck": {"steps": 50, "lr": 0.1, "optimizer": "rmsprop", "readout": "alpha",
                                "max_batches": 20, "batch_size": 64},
        "Guan": {"steps": 50, "lr": 0.1, "lam": 0.1, "optimizer": "rmsprop", "readout": "inverse"},
        # the sst-erasure suite's budget; the network trained on the model's
        # prediction (target "predicted": one that reads a sampled target steers the
        # noisy output toward it), lr and beta chosen on held-out train sentences by
        # benchmarks.studies.readout_tuning --suite sst (docs/results/sst-readout-tuning.md):
        # the largest beta whose network keeps the prediction on 90 % of them, 0.01 / H
        # (H = 384; at IBA's 10 / H every network shuts nearly everything: at the input
        # a token's information costs more than the whole task gains)
        "ReadoutBottleneck": {"batch_size": 64, "max_steps": 400, "lr": 1e-3, "beta": 0.01 / 384, "target": "predicted"},
    },
    "cls_sentences": None,  # None: every sentence of the evaluated split
    "heatmap_sentences": 3,
    "heatmap_max_tokens": 16,
    "pos": "auto",  # "auto": group by POS when the pos extra is installed; True: require it
    "speed": {"sentences": 32, "batch_size": 32, "finetune_batches": 12, "ig_steps": 50, "fit_steps": 10},
    "cache": True,
}

QUICK: Dict[str, Any] = {
    "seeds": [0, 1],
    "stability_seeds": {"seeds": [2], "layers": [0, 2]},
    "train_sentences": 1000,
    "eval_sentences": 200,
    # two blocks of MiniLM with a fresh head need a larger step to leave the
    # majority class (lr 5e-5 or 1e-4 on 1500 sentences: one class predicted)
    "model": {"num_layers": 2, "epochs": 4, "lr": 5e-4},
    "workers": 1,
    "diffmask": {"epochs": 1, "validation_sentences": 100, "batch_size": 32,
                 "certificate": {"steps": 10, "closure_examples": 4}},
    "method_options": {"IntegratedGradients": {"n_steps": 20}, "PerSampleBottleneck": {"steps": 10, "max_batches": 4},
                       "Guan": {"steps": 10}},
    "heatmap_sentences": 2,
    "paper_recipe": {"epochs": 1},
    "speed": {"sentences": 16, "batch_size": 16, "finetune_batches": 4, "ig_steps": 20, "fit_steps": 4},
}

#: What each choice of :data:`DEFAULTS` was made on (never the split the suite
#: scores, dev): ``on`` is ``"train"`` (train sentences the fits do not see) or
#: ``"rule"`` (fixed in advance, not measured); ``why`` says how, and where.
CHOSEN_ON: Dict[str, Dict[str, str]] = {
    "model epoch": {"on": "rule", "why": "3 epochs fixed in advance, the last kept (dev is scored after each epoch "
                                         "for the record; the model before this rule was the best dev epoch, 2 of 3)"},
    "eps": {"on": "train", "why": "the sparsest eps whose probe keeps the masked macro-F1 within one point of the "
                                  "model's on 1000 held-out train sentences: 0.01 in both modes "
                                  "(docs/results/sst-eps-frontier.md, sst-eps-layers-input.md, on the model of "
                                  "the best dev epoch; this model is the next epoch's)"},
    "l0": {"on": "rule", "why": "the L0 as the share of kept positions, so that eps and the penalty do not depend "
                                "on sentence length (first picked beside dev scores, docs/reproduction/sst-bert.md; "
                                "kept on that argument, not re-measured)"},
    "deployed read-out": EVERY_STEP_DEPLOYED_CHOSEN_ON,
    "checkpoint": {"on": "rule", "why": "the fit's last probe (select_checkpoint False); no epoch is selected"},
    "stability seeds": {"on": "rule", "why": "the paper's 5 seeds; seeds 2-4 at layers 0, 3 and 6 only (bottom, "
                                             "middle, top), fixed in advance for the CPU's budget"},
    "fit budget": {"on": "rule", "why": "fit's defaults (run until every layer has its verdict), capped at 5 000 "
                                        "steps a layer; the certificate's 500 further steps"},
    "cool-down": {"on": "train", "why": "at least 500 steps at 0.1 x the rates, fixed before the run that measured it "
                                       "on the 400 held-out train sentences (docs/results/certificate-noise.md); "
                                       "begun at the criterion's budget at the latest and run until the verdicts "
                                       "hold again on it (by rule: a verdict judged on the cooled windows)"},
    "multiplier tolerance": {"on": "train", "why": "fit's default (tol_lambda 0.5) kept: on the three stability-seed "
                                                  "fits whose probes it did not all count (input seeds 2 and 3, hidden "
                                                  "seed 4), 0.2 counted as many (6 of 9 each way, on the 400 held-out "
                                                  "train sentences): it moved the misses from the certificate's drift "
                                                  "to the held-out KL (docs/reproduction/sst-bert.md)"},
    "methods' options": {"on": "rule", "why": "DiffMask's own SST comparison (algorithms.md 1.10); the Readout "
                                              "Bottleneck's lr and beta on held-out train sentences "
                                              "(docs/results/sst-readout-tuning.md)"},
}

#: The paper's numbers (Section 6.1 and its sentiment appendix) the report gives beside ours.
PAPER = {"input_masked": 46.3, "hidden_masked": 67.6, "input_f1": 38.3, "hidden_f1": 38.9, "unmasked_f1": 37.9,
         "input_std": 0.05, "hidden_std": 0.03, "cls_diffmask": 99.0, "cls_bottleneck": 71.0}

#: The targets of fit's defaults: per mode, the most mean std of the attributions
#: across seeds, and the least masked share (that of the earlier recipe,
#: ``LEGACY_FIT`` with per-layer multiplier rates: 25.8 % and 48.2 %).
STABILITY_TARGETS = {"input": (0.10, 25.8), "hidden": (0.06, 48.2)}
#: The attribution targets: DiffMask at every layer at most this many forward
#: passes, and at least this many times faster than IG with 50 steps.
ATTRIBUTION_RATIO_MAX, IG_SPEEDUP_MIN = 1.5, 50
