"""The local engine's data-parallel training state under torchrun (``docs/distributed.md``).

``grads`` sums LoRA (and critic) gradients over the ranks in fp32 buckets; ``fsdp`` shards full
fine-tuning with FSDP2 and keeps each rank's full copy for the sampler; ``dcp`` saves and loads
those shards with ``torch.distributed.checkpoint``. The job's data-parallel context (ranks,
collectives with a named failure) comes in from ``searchr1.distributed``; nothing here imports it.
"""
