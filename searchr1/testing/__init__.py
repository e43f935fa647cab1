"""Test support shipped with the package: a loopback fake Zhihu server and the tiny-model
fault runs built on it, shared by ``tests/test_fault_matrix.py`` and
``experiments/reliability/fault_matrix.py`` (one copy of each). Nothing here is used by a run.
"""
