"""Does DiffMask's fit converge with its defaults on data it was never tuned on?

A grid of toy data sets (seeds this project has not used elsewhere) x fit seeds x
two task shapes (the paper's: 10 digits, length <= 10; a larger one: 20 digits,
length <= 20). Per data set a toy model is trained (cached); per cell DiffMask is
fitted with ``fit``'s defaults and only the task's eps (hidden mode at the FFNN
output, ``hidden.1``; and input mode at layer 1 with votes read from the states
alone), and its held-out attribution scored by JS to the ground truth. The
report gives every cell, the median and worst, the convergence status of every
fit, and the wall time.


The package: :mod:`.orchestration` (its run and report).
"""

from benchmarks.suites.toy_robustness.orchestration import (
    CHOSEN_ON, data_set_cells, DEFAULTS, DESCRIPTION, fit_cell, headline, QUICK, run, summarize_cells, write_report,
)

__all__ = ["CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "QUICK", "data_set_cells", "fit_cell", "headline", "run", "summarize_cells",
           "write_report"]
