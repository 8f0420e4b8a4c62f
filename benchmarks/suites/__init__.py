"""One module per experiment; see :mod:`benchmarks.runner` for what a suite provides."""
