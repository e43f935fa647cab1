"""The vLLM sampler's worker: one thread owns an in-process vLLM engine and feeds it.

vLLM's ``LLMEngine`` is not thread-safe, so every call to it — adding requests, ``step()``,
loading weights, sleeping and waking — happens on one worker thread, as in the slot sampler
(``slot_engine.py``): callers ``submit`` sequences with the weights they want (a
``WeightsSource``) and get a future. The thread loops:

1. **admit** queued sequences whose weights are the engine's; when a request brings other
   weights (after ``optim_step``, or the adapters-off base model), admission stops until the
   sequences in flight finish (drain), then the new weights are pushed in place and the prefix
   cache is reset;
2. **step** the engine (continuous batching, prefix caching, CUDA graphs: vLLM's), collecting the
   sequences that finished.

Sleep (``request_sleep``, asked when training starts): once idle, the engine sleeps at
``engine.vllm.sleep_level`` — 1 offloads the weights to host memory and drops the KV cache, 2
drops both — and the next request wakes it: weights first, then (after a push if the weights
changed or were dropped) the KV cache, whose prefix cache is reset on every wake since its
blocks are gone. A device error fails the requests in flight and the worker keeps serving.
"""

from __future__ import annotations

import itertools
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from searchr1.engines.local.sampling.slot_types import WeightsSource
from searchr1.engines.local.sampling.vllm_api import Completion
from searchr1.engines.local.sampling.worker import EngineWorker

log = logging.getLogger(__name__)


@dataclass
class VllmRequest:
    """One ``submit`` call: a prompt, one vLLM params object per sequence, the weights, the future."""

    tokens: list[int]
    params: list[object]
    source: WeightsSource
    future: Future = field(default_factory=Future)
    results: list[Completion | None] = field(default_factory=list)
    pending: int = 0


@dataclass
class VllmStats:
    """Work counters (read by tests, benchmarks and the step profile)."""

    steps: int = 0  # engine steps (one scheduler iteration: prefill chunks and/or a decode token)
    step_seconds: float = 0.0  # time inside ``step()``
    in_flight_steps: int = 0  # sum over steps of the sequences in flight (÷ steps: mean rows)
    sequences: int = 0
    sampled_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache served
    pushes: int = 0  # weight loads into the engine
    push_seconds: float = 0.0
    sleeps: int = 0
    wake_seconds: float = 0.0


class VllmEngine(EngineWorker):
    """An in-process vLLM engine behind a worker thread (see the module docstring)."""

    def __init__(self, api, engine, weights_of, sleep_level: int = 2, release_cache=lambda: None) -> None:
        if sleep_level not in (1, 2):
            raise ValueError(f"engine.vllm.sleep_level={sleep_level}; valid: 1, 2")
        self.api, self.engine = api, engine
        self.weights_of = weights_of  # model → iterator of (HF name, tensor), adapters folded
        self.sleep_level = sleep_level
        # hands the trainer's cached, unused device memory back before vLLM maps its own again
        # (torch's allocator keeps the update's activations cached: without this a wake runs out)
        self.release_cache = release_cache
        self.stats = VllmStats()
        self._identity: tuple | None = None  # the weights admitted sequences sample from
        self._pushed: tuple | None = None  # the weights loaded in the engine (None: not ours)
        self._ids = itertools.count()
        self._start_worker("vllm-sampler")  # _queue: (VllmRequest, index); _live: request id → the same

    # ----- public ---------------------------------------------------------------------------
    def submit(self, tokens: list[int], params: list[object], source: WeightsSource) -> Future:
        """Queue one prompt's sequences; the future resolves to their ``Completion``s, in order."""
        request = VllmRequest(tokens, params, source, results=[None] * len(params), pending=len(params))
        request.future.set_running_or_notify_cancel()
        self._enqueue((request, i) for i in range(len(params)))
        return request.future

    # ----- worker (the loop: worker.py) -------------------------------------------------------
    def _serve(self, admitted: list[tuple[VllmRequest, int]]) -> None:
        if admitted:
            self._ready(admitted[0][0].source)
            self._add(admitted)
        if self._live:
            self._step()

    def _take(self) -> list[tuple[VllmRequest, int]]:
        """Pop the queued sequences of one weights' identity; another identity waits for a drain."""
        admitted: list[tuple[VllmRequest, int]] = []
        while self._queue:
            request, index = self._queue[0]
            identity = request.source.identity()
            if identity != self._identity:
                if self._live or admitted:
                    break  # drain before the weights change
                self._identity = identity
            admitted.append((request, index))
            self._queue.popleft()
        return admitted

    def _ready(self, source: WeightsSource) -> None:
        """Wake if asleep; push ``source``'s weights when they are not the ones loaded."""
        woke, start = self.asleep, time.perf_counter()
        if woke:
            self.release_cache()
            self.engine.wake_up(["weights"])
        if self._pushed != source.identity():
            self._push(source)
        if woke:
            self.engine.wake_up(["kv_cache"])
            self.engine.reset_prefix_cache()  # its blocks went with the KV cache
            self.asleep = False
            self.stats.wake_seconds += time.perf_counter() - start

    def _push(self, source: WeightsSource) -> None:
        start = time.perf_counter()
        lock = source.lock
        if lock is not None:
            with lock:
                self.api.load_weights(self.engine, self.weights_of(source.model))
        else:
            self.api.load_weights(self.engine, self.weights_of(source.model))
        self.engine.reset_prefix_cache()
        self._pushed = source.identity()
        self.stats.pushes += 1
        self.stats.push_seconds += time.perf_counter() - start

    def _add(self, admitted: list[tuple[VllmRequest, int]]) -> None:
        for request, index in admitted:
            rid = str(next(self._ids))
            self.engine.add_request(rid, self.api.prompt(request.tokens), request.params[index])
            self._live[rid] = (request, index)
            self.stats.sequences += 1
            self.stats.prompt_tokens += len(request.tokens)

    def _step(self) -> None:
        start = time.perf_counter()
        self.stats.in_flight_steps += len(self._live)
        outputs = self.engine.step()
        self.stats.steps += 1
        self.stats.step_seconds += time.perf_counter() - start
        for output in outputs:
            if output.finished:
                self._finish(self.api.completion(output))

    def _finish(self, done: Completion) -> None:
        request, index = self._live.pop(done.request_id)
        request.results[index] = done
        request.pending -= 1
        self.stats.sampled_tokens += len(done.tokens)
        self.stats.cached_tokens += done.cached_tokens
        if request.pending == 0 and not request.future.done():
            request.future.set_result(request.results)

    def _sleep(self) -> None:
        if self.asleep:
            return
        self.engine.sleep(level=self.sleep_level)
        self.asleep = True
        if self.sleep_level == 2:
            self._pushed = None  # the weights are gone: the next wake pushes them again
        self.stats.sleeps += 1

    def _fail_all(self, error: BaseException, admitted) -> None:
        """Fail every request in flight (and their queued sequences); abort them in the engine."""
        failed = {id(r): r for r, _ in [*self._live.values(), *admitted]}
        with self._cv:
            kept = [(r, i) for r, i in self._queue if id(r) not in failed]
            self._queue.clear()
            self._queue.extend(kept)
        rids = list(self._live)
        self._live.clear()
        try:
            if rids:
                self.engine.abort_request(rids)
        except Exception:  # noqa: BLE001 - the engine may be what failed
            log.exception("vLLM: aborting the failed requests failed too")
        for request in failed.values():
            if not request.future.done():
                request.future.set_exception(error)
