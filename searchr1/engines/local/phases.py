"""Memory time-sharing between the rollout phase and the training phase on one GPU.

A step samples first (the slot sampler's KV pool is the big buffer) and trains afterwards
(gradients, optimizer moments and activations are). ``Phases`` hears of each switch from the
training client: any training call starts the training phase, handing out the rollout's
sampler starts the rollout phase. With ``sleep_between_phases`` the slot sampler releases
its KV pool (and its captured graphs, which point into it) when training starts and
allocates them again on the next request (vLLM, ``engine.sampler=vllm``, always sleeps: its
memory share is sized for the rollout alone); with ``offload_optimizer`` AdamW's moments go to
host memory for the rollout and come back for the update. Switching twice to the same
phase does nothing. ``seconds`` totals the time spent switching (the benchmark reports it).
On a CPU engine every switch also hands the host heap's free pages back
(``utils/host_memory.release``): the rollout's and the update's transient tensors differ, and
glibc would keep both. (On a GPU the tensors live on the device, and the ``gc`` pass would
only add to the step.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from searchr1.utils import host_memory


class Phases:
    """Which phase the engine is in, and what each switch frees or restores."""

    def __init__(self, sleep_between_phases: bool = False, offload_optimizer: bool = False,
                 sleep: Callable[[], None] = lambda: None, release_host_memory: bool = True) -> None:
        self.sleep_between_phases = sleep_between_phases
        self.release_host_memory = release_host_memory
        self.offload_optimizer = offload_optimizer
        self.sleep = sleep  # asks the sampling engines to release their memory once idle
        self.optimizer = None  # set by the training client
        self.phase: str | None = None
        self.switches = 0
        self.seconds = 0.0

    def training(self) -> None:
        """Enter the training phase: ask the sampler to sleep, bring optimizer state back."""
        if self.phase == "training":
            return
        start = time.perf_counter()
        if self.sleep_between_phases:
            self.sleep()
        if self.offload_optimizer and self.optimizer is not None:
            self.optimizer.onload()
        self._switched("training", start)

    def rollout(self) -> None:
        """Enter the rollout phase: optimizer state to host (the sampler wakes on its own)."""
        if self.phase == "rollout":
            return
        start = time.perf_counter()
        if self.offload_optimizer and self.optimizer is not None:
            self.optimizer.offload()
        self._switched("rollout", start)

    def _switched(self, phase: str, start: float) -> None:
        if self.release_host_memory:
            host_memory.release()
        self.phase = phase
        self.switches += 1
        self.seconds += time.perf_counter() - start
