"""Data parallelism on ``torch.distributed`` under ``torchrun`` (``docs/distributed.md``).

``launch`` starts the process group from torchrun's environment and returns the
``DataParallel`` context the loop and the engine share; ``split`` puts whole groups on ranks;
``reduce`` reduces metrics per kind; ``grads`` all-reduces LoRA gradients; ``fsdp`` shards
full fine-tuning with FSDP2.
"""
