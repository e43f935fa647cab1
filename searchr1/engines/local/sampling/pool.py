"""The local service's samplers: one sampling engine for every client of the served model.

The policy's sampler, the adapters-off base view, the frozen reference copy and a saved
checkpoint's copy are all the same architecture, so one engine serves them all, switching
weights when a request brings other ones: one slot sampler (one KV pool) or one vLLM engine per
service, never one per client. ``engine.sampler`` picks it:

- ``hf``: the batched HF decode (no engine; each client decodes in its own worker);
- ``slots``: the slot sampler (``slot_engine.py``); ``auto`` takes it on CUDA for Llama-family
  models and the HF decode elsewhere;
- ``vllm``: vLLM in this process (``vllm_*.py``), started by ``start_vllm`` when the service is
  built, so a run that cannot fit exits 2 before any work.

``sleep()`` asks the engine to release its memory while training (``engine.sleep_between_phases``
for the slot sampler; always for vLLM, whose share is sized for the rollout phase alone).
"""

from __future__ import annotations

from searchr1.engines.local.config import LocalEngineConfig
from searchr1.engines.local.sampling.requests import eos_ids_of
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient, build_slot_engine
from searchr1.engines.local.sampling.slot_types import WeightsSource
from searchr1.engines.local.sampling.vllm_client import VllmSamplingClient
from searchr1.engines.local.sampling.vllm_engine import VllmEngine

_UNSET = object()


class SamplerPool:
    """The sampling engine of one served model and the clients that share it."""

    def __init__(self, engine_cfg: LocalEngineConfig, tokenizer) -> None:
        self.cfg = engine_cfg
        self.tokenizer = tokenizer
        self._slots = _UNSET  # built on the first client: a SlotEngine, or None (HF decode)
        self.vllm: VllmEngine | None = None
        self._vllm_detokenize = False

    def attach_vllm(self, engine: VllmEngine, detokenize: bool) -> None:
        """Serve every client from ``engine`` (``vllm_start.start_vllm`` opened it)."""
        self.vllm, self._vllm_detokenize = engine, detokenize

    def client(self, model, model_lock=None, weights_version=None):
        """A sampling client of ``model``'s weights (as they are when each request runs).

        ``weights_version`` (a callable) tells when the weights change: the HF decode then reuses
        a trajectory's previous-turn KV, and the engines refold or push the weights on a change.
        """
        if self.vllm is not None:
            scorer = LocalSamplingClient(model, self.tokenizer, self.cfg, model_lock, slots=None)
            source = WeightsSource(model, weights_version or (lambda: 0), model_lock)
            return VllmSamplingClient(self.vllm, source, self.tokenizer, self.cfg.max_seq_len, scorer,
                                      detokenize=self._vllm_detokenize, seeded=self.cfg.vllm.seeded,
                                      seed=self.cfg.seed)
        return LocalSamplingClient(model, self.tokenizer, self.cfg, model_lock, weights_version,
                                   slots=self._slot_engine(model))

    def _slot_engine(self, model):
        if self._slots is _UNSET:
            self._slots = build_slot_engine(model, self.cfg, eos_ids_of(model, self.tokenizer), len(self.tokenizer))
        return self._slots

    def engines(self) -> list:
        """The engines that hold device memory (for sleeping between phases)."""
        found = [self.vllm] if self.vllm is not None else []
        if self._slots is not _UNSET and self._slots is not None:
            found.append(self._slots)
        return found

    def sleep(self) -> None:
        """Ask every engine to release its memory once idle; the next request restores it."""
        for engine in self.engines():
            engine.request_sleep()

