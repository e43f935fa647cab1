"""Engines (``engine.name``): service clients with the PyTRIO ``ServiceClient`` surface.

An engine factory takes ``(engine_cfg, model_cfg, run_dir, limits, dp)``: its own config (the
``engine`` group's schema), the model's, the run directory, the loop's ``LoopLimits`` and the
job's data-parallel context (``None``: one process), both declared in ``engines/base.py``. It
returns a service with ``get_tokenizer()``, ``create_sampling_client(model_path=None)`` (None =
the frozen base model, used for eval of the base and for KL reference logprobs),
``create_lora_training_client(rank, seed)`` and
``create_training_client_from_state_with_optimizer(path)``. Modules register on import; the
local factory imports its engine when called, so composing a config never loads torch, and
``trio`` imports pytrio on first use, so the local engine never needs a login.
"""

from __future__ import annotations

from searchr1.engines.trio import TrioService
from searchr1.utils.registry import Registry

ENGINES: Registry = Registry("engine")


@ENGINES.register("local")
def _local(engine_cfg, model_cfg, run_dir, limits=None, dp=None):
    from searchr1.engines.local.service import LocalService  # lazy: torch and transformers

    return LocalService(engine_cfg, model_cfg, run_dir, limits, dp)


@ENGINES.register("trio")
def _trio(engine_cfg, model_cfg, run_dir, limits=None, dp=None):  # one process (startup checks)
    return TrioService(engine_cfg, model_cfg, run_dir)
