"""A fake PyTRIO Actor that queues training events, and clients that schedule or log calls.

``QueuedTrio`` is ``tests/helpers/trio_fake.py``'s server with the Actor protocol's
asynchronous path: ``POST /v1/events`` answers ``accepted`` at once, the Actor runs the
events one at a time in arrival order (each taking ``compute[type]`` seconds), and pytrio's
long poll ``GET /v1/events/{id}`` is answered when that event has run. Every request spends
``rtt`` seconds on the network (half each way). With ``accept=False`` a POST is answered
only once its event has run, as ``tests/loop/test_staleness.TimedTrio`` does. A forward's
log-probs depend on how many optimizer steps ran before it (``version``), so results show
the order the Actor ran events in. ``runs`` records what ran when: (type, start, end).

Why not ``tests/loop/test_staleness.TimedTrio``: it answers a POST only once the event's
latency has passed, and pytrio 0.2.9 sends one event at a time, each held until its POST is
answered (``ActorTrainingRunCoordinator._submit_queued_event``), so under it no client
schedule can overlap one call with the next.

``Sequential`` is the call-by-call schedule as a client: each training call returns only
once its result is in (the loop before pipelining). ``Recording`` logs, in order, when each
call is submitted, when its result is awaited and when it arrived.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import msgpack
import numpy as np
from pytrio.protocol.actor.events.tensor import WireTensorData
from pytrio.types import APIFuture

from tests.helpers.trio_fake import FakeTrio

FB = "trainer.forward_backward"
OPTIM = "trainer.optimize_step"
TRAINING_CALLS = ("forward_backward", "forward_backward_custom", "optim_step")


class QueuedTrio(FakeTrio):
    """FakeTrio whose Actor queues events (see the module docstring)."""

    def __init__(self, *args, rtt: float = 0.0, compute: dict[str, float] | None = None,
                 accept: bool = True, **kw) -> None:
        super().__init__(*args, **kw)
        self.rtt = rtt
        self.accept = accept  # False: a POST is answered with the event's result
        self.compute = compute or {}  # Actor event type -> seconds
        self.version = 0  # optimizer steps run so far
        self.runs: list[tuple[str, float, float]] = []
        self._finished: dict[str, asyncio.Future] = {}
        self._tail: asyncio.Future | None = None  # the last event queued
        self._tasks: set[asyncio.Task] = set()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.url.host != "actor.test" or not path.startswith("/v1/events"):
            return await super().handle(request)
        body = await request.aread()
        with self._lock:
            self.requests.append((request.method, f"{request.url.host}{path}"))
        await asyncio.sleep(self.rtt / 2)  # on the way to the Actor
        if request.method == "POST":
            envelope = msgpack.unpackb(body, raw=False)
            finished = self._enqueue(envelope)
            reply = {"version": 1, "event_id": envelope["event_id"], "type": envelope["type"],
                     "status": "accepted"} if self.accept else await asyncio.shield(finished)
        else:  # the long poll: answered once the event has run
            finished = self._finished.get(path.rsplit("/", 1)[-1])
            if finished is None:
                return self._unexpected(request.method, f"actor {path}")
            reply = await asyncio.shield(finished)
        await asyncio.sleep(self.rtt / 2)  # on the way back
        return httpx.Response(200, content=msgpack.packb(reply, use_bin_type=True),
                              headers={"content-type": "application/msgpack"})

    def _enqueue(self, envelope: dict) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        before = self._tail if self._tail is not None and self._tail.get_loop() is loop else None
        finished = self._finished[envelope["event_id"]] = self._tail = loop.create_future()

        async def run() -> None:
            if before is not None:
                await before
            start = time.perf_counter()
            await asyncio.sleep(self.compute.get(envelope["type"], 0.0))
            reply = msgpack.unpackb(self._event(envelope).content, raw=False)
            self.runs.append((envelope["type"], start, time.perf_counter()))
            finished.set_result(reply)

        task = loop.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return finished

    def _event(self, envelope: dict) -> httpx.Response:
        response = super()._event(envelope)
        if envelope["type"] == OPTIM:
            self.version += 1
        return response

    def _forward_result(self, payload: dict) -> dict:
        """Log-prob −0.5 − 0.01·version at every position; the loss weighs −log-prob by the
        datum's advantages (else weights, else 1) over the active targets."""
        lp = -0.5 - 0.01 * self.version
        outputs, active, loss = [], 0, 0.0
        for datum in payload["data"]:
            targets = datum["target_ids"]
            w = datum.get("advantages") or datum.get("weights") or [1.0] * len(targets)
            outputs.append({"logprobs": WireTensorData.from_numpy(
                np.full(len(targets), lp, dtype=np.float32)).to_wire_value()})
            on = [t != -100 for t in targets]
            active += sum(on)
            loss += float(sum(-lp * x for x, a in zip(w, on) if a))
        return {"loss_fn_outputs": outputs,
                "metrics": {"loss_sum": loss, "loss_mean": loss / max(active, 1), "token_count": active}}

    def optim_period(self) -> float:
        """Median seconds from one optim_step's end to the next's (a mini-batch in steady state)."""
        ends = sorted(e for kind, _, e in self.runs if kind == OPTIM)
        return float(np.median(np.diff(ends))) if len(ends) > 1 else float("nan")

    def idle_between_runs(self) -> float:
        """Seconds the Actor sat idle between its first training run and its last."""
        runs = sorted((s, e) for kind, s, e in self.runs if kind in (FB, OPTIM))
        return sum(max(0.0, b[0] - a[1]) for a, b in zip(runs, runs[1:]))


class _Passthrough:
    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Sequential(_Passthrough):
    """Every training call waits for its own result before returning (the call-by-call loop)."""

    def __getattr__(self, name):
        call = getattr(self.inner, name)
        if name not in TRAINING_CALLS:
            return call
        return lambda *a, **kw: APIFuture.completed(call(*a, **kw).result())


class Recording(_Passthrough):
    """Logs ("submit" | "await" | "done", "<call>#<n>") in the order it happens."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.log: list[tuple[str, str]] = []

    def __getattr__(self, name):
        call = getattr(self.inner, name)
        if name not in TRAINING_CALLS:
            return call

        def submit(*a, **kw):
            label = f"{name}#{sum(x.startswith(name + '#') for x in self.submitted())}"
            future = call(*a, **kw)
            self.log.append(("submit", label))
            return _Watched(future, label, self.log)

        return submit

    def submitted(self) -> list[str]:
        return [label for what, label in self.log if what == "submit"]


class _Watched:
    def __init__(self, future, label: str, log: list) -> None:
        self.future, self.label, self.log = future, label, log

    def result(self, timeout: float | None = None):
        self.log.append(("await", self.label))
        value = self.future.result(timeout)
        self.log.append(("done", self.label))
        return value
