"""The faithfulness suite: every method's input-token scores on the sst suite's
fine-tuned MiniLM, scored by ERASER's comprehensiveness and sufficiency at top-k
fractions and their AOPC (tokens removed by a baseline embedding or from the
attention mask), and by plausibility against SST's word labels.

The package: :mod:`.settings`, :mod:`.rationales` (which tokens are words, the
human rationales), :mod:`.scoring`, :mod:`.figure`, :mod:`.export` (ERASER's
JSONL formats), :mod:`.orchestration` (:func:`run`) and :mod:`.report`
(:func:`write_report`).
"""

from .orchestration import run
from .rationales import rationale_masks, VARIANTS, word_tokens
from .report import write_report
from .scoring import across_seeds, per_sentence_metrics, summarize
from .settings import DEFAULTS, DESCRIPTION, METHODS, QUICK

__all__ = ["DEFAULTS", "DESCRIPTION", "METHODS", "QUICK", "VARIANTS", "across_seeds", "per_sentence_metrics",
           "rationale_masks", "run", "summarize", "word_tokens", "write_report"]
