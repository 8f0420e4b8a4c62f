"""What several suites and studies share, beside the harness's own modules
(``runner``, ``records``, ``report``, ``methods``, ``progress``, ``workers``):
the MiniLM suites' loading, fitting, fit cache and attributions
(:mod:`benchmarks.common.minilm`), and the set-up of the timing studies on the
sst suite's MiniLM (:mod:`benchmarks.common.sst_timing`). A suite or a study
imports these, and other suites' public names (their package's ``__all__``),
never another suite's modules."""
