"""The components suite: DiffMask over attention heads and MLP units.

Amortised DiffMask (``mode="heads"`` / ``"units"``), the per-task mask
(Subnetwork Probing) and attribution patching, scored against the components
that tracr's compiled programs use (:mod:`.tracr`), and the heads per layer
each SST sentence needs on the fine-tuned MiniLM (:mod:`.sst_heads`), with
figures (:mod:`.figures`) and the cost; ``python -m benchmarks run components``.
"""

from benchmarks.suites.components.orchestration import run
from benchmarks.suites.components.report import write_report
from benchmarks.suites.components.settings import CHOSEN_ON, DEFAULTS, DESCRIPTION, QUICK
from benchmarks.suites.components.sst_heads import fit_arguments, score_heads, spread, sst_config
from benchmarks.suites.components.tracr import (
    active_components, against_truth, quiet_warnings, random_inputs, scaled_read_out, score_mask,
)

__all__ = ["CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "QUICK", "active_components", "against_truth", "fit_arguments", "quiet_warnings",
           "random_inputs", "run", "scaled_read_out", "score_heads", "score_mask", "spread", "sst_config",
           "write_report"]
