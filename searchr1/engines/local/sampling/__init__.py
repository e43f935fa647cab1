"""The local engine's samplers: the HF batched decode (CPU) and the slot sampler (CUDA)."""
