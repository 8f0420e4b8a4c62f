"""The toy task of De Cao et al. (2020), Section 4: does an attribution to the
hidden states at the FFNN output (``hidden.1``) match the known ground truth
(the positions holding a query digit)? And what does each method cost?

Per seed: generate 10k sequences (10% held out), train the toy model (cached),
set every method up (DiffMask is fitted on the training set, the bottleneck's
statistics are estimated there), attribute the held-out set at ``layer=1``, and
score JS and KL(ground truth || attribution) per example. On the first seed also:
the speed of every method on one held-out batch against a plain forward pass,
and the figures.

The package: :mod:`.settings` (the configuration, the paper's numbers),
:mod:`.scoring` (a method's scores against the ground truth, the means over
seeds, the targets), :mod:`.orchestration` (:func:`run`), :mod:`.figures` and
:mod:`.prose` (the report's notes).
"""

from benchmarks.suites.toy.orchestration import run
from benchmarks.suites.toy.scoring import (
    aggregate, checks, load_toy_model, method_context, score, seed_data, stopping_data,
)
from benchmarks.suites.toy.settings import (
    CHOSEN_ON, DEFAULTS, DESCRIPTION, METRICS, MODEL_EPOCH_CHOSEN_ON, PAPER, PAPER_SOURCE, QUICK,
)

__all__ = ["CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "METRICS", "MODEL_EPOCH_CHOSEN_ON", "PAPER", "PAPER_SOURCE", "QUICK", "aggregate", "checks",
           "load_toy_model", "method_context", "run", "score", "seed_data", "stopping_data"]
