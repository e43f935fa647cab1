"""The local engine's samplers (``engine.sampler``): the HF batched decode (CPU), the slot sampler (CUDA) and the vLLM client (``vllm_*.py``), behind one pool (``pool.py``)."""
