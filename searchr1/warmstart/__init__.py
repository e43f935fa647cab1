"""The supervised warm start (``warmstart=oracle_sft | embedded``, ``mode=sft``).

- ``oracle``: diverse oracle trajectories for world questions, rendered token-exactly by the
  configured protocol with real observations from the configured retriever;
- ``sft``: cross-entropy steps through the engine's training client (local or trio);
- ``cache``: fingerprints, the on-disk cache and the compact (bf16) adapter format;
- ``apply``: the trainer's hook (``apply_warm_start``) and ``mode=sft``.
"""
