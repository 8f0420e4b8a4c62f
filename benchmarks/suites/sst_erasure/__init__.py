"""SST, erasure agreement (De Cao et al. 2020, Section 5, Table 2, and beyond):
how close does each attribution method come to exact erasure on real sentences?

A single-layer GRU sentiment classifier over frozen MiniLM word-piece vectors
is trained on SST train (5 classes; every phrase of the train trees; the last
of its epochs kept, cached). Its tokens are the word pieces it reads, ``[CLS]`` and
``[SEP]`` included (``unit="word"``: words). On every sentence of the evaluated
split with at most ``max_tokens`` tokens, exact erasure finds all the smallest
sets of kept tokens that keep the predicted class when every other token is
replaced by a fixed baseline. Then:

- per-example DiffMask and REINFORCE (the authors' reward, and the corrected
  Lagrangian one), masks optimised for each sentence against that same
  baseline, each mask chosen by the method's own objective, run once per seed:
  precision, recall and F1 of the kept tokens against the closest optimal set,
  optimality, L0 and sufficiency, beside the paper's numbers, with the std over
  the seeds, a paired bootstrap interval of DiffMask's differences from
  REINFORCE over the sentences, and where their masks miss the optimum;
- every other method (Integrated Gradients, Occlusion, Per-Sample Bottleneck,
  Guan, amortised DiffMask fitted on train, random scores) keeps its top-k
  tokens with k = the optimal size and gets the same scores;
- seconds per sentence of every method, erasure included, in the same run.

The figure shows a few sentences with each method's kept tokens.

The package: :mod:`.settings` (the configuration, the paper's numbers),
:mod:`.loading` (the splits, the token unit, the GRU, the baseline),
:mod:`.attributions` (exact erasure and the methods at work), :mod:`.scoring`
(the reference and the numbers), :mod:`.orchestration` (:func:`run`),
:mod:`.figure`, :mod:`.prose` (the notes and the comparison's paragraph) and
:mod:`.report` (:func:`write_report`).
"""

from benchmarks.suites.sst_erasure.attributions import (
    fit_amortised_diffmask, MaskedPredictor, MaskRun, run_erasure, run_mask_method,
)
from benchmarks.suites.sst_erasure.figure import kept_words_figure, make_figure, pick_sentences
from benchmarks.suites.sst_erasure.loading import (
    erasure_baseline, load_bench, load_model, load_splits, select_sentences, token_unit, TokenUnit,
)
from benchmarks.suites.sst_erasure.orchestration import erasure_reference, mask_run_info, run
from benchmarks.suites.sst_erasure.prose import summary_notes, versus_paragraph
from benchmarks.suites.sst_erasure.report import write_report
from benchmarks.suites.sst_erasure.scoring import checks, combine_summaries, compare_pairs, miss_breakdown
from benchmarks.suites.sst_erasure.settings import (
    CHOSEN_ON, DEFAULTS, DESCRIPTION, MASK_METHODS, METRICS, PAPER, PAPER_SOURCE, QUICK,
)

#: The suite's own rows, beside the library's registered methods (``--methods``).
EXTRA_METHODS = tuple(MASK_METHODS)

__all__ = [
    "CHOSEN_ON", "EXTRA_METHODS", "DEFAULTS", "DESCRIPTION", "MASK_METHODS", "METRICS", "PAPER", "PAPER_SOURCE", "QUICK",
    "MaskRun", "MaskedPredictor", "TokenUnit", "checks", "combine_summaries", "compare_pairs", "erasure_baseline",
    "erasure_reference", "fit_amortised_diffmask", "kept_words_figure", "load_bench", "load_model", "load_splits",
    "make_figure", "mask_run_info", "miss_breakdown", "pick_sentences", "run", "run_erasure", "run_mask_method",
    "select_sentences", "summary_notes", "token_unit", "versus_paragraph", "write_report",
]
