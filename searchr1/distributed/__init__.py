"""Data parallelism of a job on ``torch.distributed`` under ``torchrun`` (``docs/distributed.md``).

``launch`` starts the process group from torchrun's environment and returns the
``DataParallel`` context (``context``) the loop and the engine share; ``split`` puts whole
groups on ranks; ``reduce`` reduces metrics per kind; ``rank0`` keeps files and trackers to
rank 0; ``sweep`` runs a sweep's jobs as torchrun groups. How the local engine shards its
training state (gradient all-reduce, FSDP2, sharded checkpoints) is the engine's own:
``searchr1/engines/local/sharding/``.
"""
