"""The toy task (paper Sec. 4) on a decoder-only language model: a config-built
Llama-style decoder reads ``<n> <m> : x ->`` and answers ``yes`` or ``no``
(:mod:`benchmarks.tasks.toy_lm`). Every method attributes the answer token (the
next-token output at the last position) to the hidden states of ``hidden.k``; the
scores on the digits of ``x`` are compared with the ground truth (the digits that
hold ``n`` or ``m``) by JS and KL, beside the GRU's numbers of the ``toy`` suite.

Per seed: data, the decoder (trained, cached), every method set up and run on the
held-out prompts, DiffMask at every layer. On the first seed also: the attribution
cost per generated token against one forward step (DiffMask, IG-50, occlusion,
through :func:`captum_diffmask.attribute_generation`) and the figures.


The package: :mod:`.orchestration` (its run and report) and :mod:`.extras` (the scoring, the first seed's extras and figures).
"""

from benchmarks.suites.toy_lm.extras import position_groups
from benchmarks.suites.toy_lm.orchestration import (
    CHOSEN_ON, checks, DEFAULTS, DESCRIPTION, extra_sections, load_decoder, METRICS, notes, QUICK, run,
)

__all__ = ["CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "METRICS", "QUICK", "checks", "extra_sections", "load_decoder", "notes",
           "position_groups", "run"]
