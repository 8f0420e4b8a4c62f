"""The components suite: DiffMask over attention heads and MLP units.

Amortised DiffMask (``mode="heads"`` / ``"units"``), the per-task mask
(Subnetwork Probing) and attribution patching, scored against the components
that tracr's compiled programs use (:mod:`.tracr`), and the heads per layer
each SST sentence needs on the fine-tuned MiniLM (:mod:`.sst_heads`), with
figures (:mod:`.figures`) and the cost; ``python -m benchmarks run components``.
"""

from .orchestration import run
from .report import write_report
from .settings import DEFAULTS, DESCRIPTION, QUICK

__all__ = ["DEFAULTS", "DESCRIPTION", "QUICK", "run", "write_report"]
