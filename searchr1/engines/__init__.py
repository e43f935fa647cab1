"""Engines (``engine.name``): service clients with the PyTRIO ``ServiceClient`` surface.

An engine factory takes ``(engine_cfg, model_cfg, run_dir, trainer_cfg)`` and returns a
service with ``get_tokenizer()``, ``create_sampling_client(model_path=None)`` (None = the
frozen base model, used for eval of the base and for KL reference logprobs),
``create_lora_training_client(rank, seed)`` and
``create_training_client_from_state_with_optimizer(path)``. Modules register on import;
``trio`` is imported lazily by its factory so the local engine never needs a login.
"""

from __future__ import annotations

from searchr1.utils.registry import Registry

ENGINES: Registry = Registry("engine")


@ENGINES.register("local")
def _local(engine_cfg, model_cfg, run_dir, trainer_cfg):
    from searchr1.engines.local.service import LocalService

    return LocalService(engine_cfg, model_cfg, run_dir, trainer_cfg)


@ENGINES.register("trio")
def _trio(engine_cfg, model_cfg, run_dir, trainer_cfg):
    from searchr1.engines.trio import TrioService

    return TrioService(engine_cfg, model_cfg, run_dir, trainer_cfg)
