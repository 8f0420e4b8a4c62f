"""The benchmark harness of captum_diffmask: every method scored side by side.

``python -m benchmarks list`` names the suites and which methods are available;
``python -m benchmarks run SUITE --out DIR [--quick] [--seeds N] [--methods ...]``
writes ``DIR/results.json``, ``DIR/report.md`` and ``DIR/figures/*.png``.
From Python: :func:`run_suite` (the same, with configuration overrides).

The harness reuses the library (``captum_diffmask.methods``,
``captum_diffmask.evaluation``) and holds no method code: the data sets and
models of the paper's tasks (:mod:`benchmarks.tasks`), a suite per experiment
(:mod:`benchmarks.suites`), one runner (:mod:`benchmarks.runner`), one report
writer (:mod:`benchmarks.report`) and the method registry, built from the
methods' own descriptions (:mod:`benchmarks.methods`); the studies beside the
suites (``sst_sweep``, ``model_zoo``, ...) are listed in ``docs/architecture.md``.
"""

from benchmarks.runner import build_config, run_suite, SUITES

__all__ = ["SUITES", "build_config", "run_suite"]
