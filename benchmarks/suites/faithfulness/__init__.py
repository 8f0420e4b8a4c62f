"""The faithfulness suite: every method's input-token scores on the sst suite's
fine-tuned MiniLM, scored by ERASER's comprehensiveness and sufficiency at top-k
fractions and their AOPC (tokens removed by a baseline embedding or from the
attention mask), and by plausibility against SST's word labels.

The package: :mod:`.settings`, :mod:`.rationales` (which tokens are words, the
human rationales), :mod:`.scoring`, :mod:`.figure`, :mod:`.export` (ERASER's
JSONL formats), :mod:`.orchestration` (:func:`run`) and :mod:`.report`
(:func:`write_report`).
"""

from benchmarks.suites.faithfulness.orchestration import run
from benchmarks.suites.faithfulness.rationales import rationale_masks, VARIANTS, word_tokens
from benchmarks.suites.faithfulness.report import headline, write_report
from benchmarks.suites.faithfulness.scoring import across_seeds, per_sentence_metrics, summarize
from benchmarks.suites.faithfulness.settings import CHOSEN_ON, DEFAULTS, DESCRIPTION, METHODS, QUICK

__all__ = [
    "headline", "CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "METHODS", "QUICK", "VARIANTS", "across_seeds",
    "per_sentence_metrics", "rationale_masks", "run", "summarize", "word_tokens", "write_report"]
