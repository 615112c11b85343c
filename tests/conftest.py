"""Shared fixtures. Tests use real parts; fakes live only in tests/fakes at the outer edges."""

import os

# One torch thread per test process: the suite runs on 2 shared cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
