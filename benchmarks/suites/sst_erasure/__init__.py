"""SST, erasure agreement (De Cao et al. 2020, Section 5, Table 2, and beyond):
how close does each attribution method come to exact erasure on real sentences?

A single-layer GRU sentiment classifier over frozen MiniLM word vectors is
trained on SST train (5 classes, selected on dev, cached). On every sentence of
the evaluated split with at most ``max_words`` words, exact erasure finds all
the smallest sets of kept words that keep the predicted class when every other
word is replaced by a fixed baseline (the mean word vector over train). Then:

- per-example DiffMask and REINFORCE (masks optimised for each sentence against
  that same baseline) are scored by their deterministic masks: precision, recall
  and F1 of the kept words against the closest optimal set, optimality (the mask
  keeps the prediction with exactly the optimal number of words), L0 (share of
  words kept) and sufficiency (the mask keeps the prediction), beside the
  paper's numbers;
- every other method (Integrated Gradients, Occlusion, Per-Sample Bottleneck,
  Guan, amortised DiffMask fitted on train, random scores) keeps its top-k words
  with k = the optimal size and gets the same scores (optimality = sufficiency
  there, as the size is right by construction);
- seconds per sentence of every method, erasure included, in the same run.

The figure shows a few sentences with each method's kept words.

The package: :mod:`.settings` (the configuration, the paper's numbers),
:mod:`.loading` (the splits and the GRU), :mod:`.attributions` (exact erasure
and the methods at work), :mod:`.scoring` (the reference and the numbers),
:mod:`.orchestration` (:func:`run`), :mod:`.figure` and :mod:`.report` (the
notes and :func:`write_report`).
"""

from .attributions import fit_amortised_diffmask, MaskedPredictor, run_erasure
from .figure import kept_words_figure, make_figure, pick_sentences
from .loading import load_model, load_splits, select_sentences
from .orchestration import run
from .report import write_report
from .scoring import checks, combine_summaries
from .settings import DEFAULTS, DESCRIPTION, MASK_METHODS, METRICS, PAPER, PAPER_SOURCE, QUICK

__all__ = [
    "DEFAULTS", "DESCRIPTION", "MASK_METHODS", "METRICS", "PAPER", "PAPER_SOURCE", "QUICK",
    "MaskedPredictor", "checks", "combine_summaries", "fit_amortised_diffmask", "kept_words_figure", "load_model",
    "load_splits", "make_figure", "pick_sentences", "run", "run_erasure", "select_sentences", "write_report",
]
