"""searchr1: a Hydra-configured experiment framework for Search-R1 (RL that teaches search)."""

import os as _os

# jax (pulled in by a retrieval library when installed) would take 75% of a GPU as it starts
_os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# OpenMP threads that wait sleep instead of spinning, so other work on the machine does not stall
# torch's thread team (searchr1/utils/cpu_threads.py); read once, when torch loads
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
