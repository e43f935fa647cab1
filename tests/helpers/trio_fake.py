"""A fake PyTRIO service behind httpx's transport: the network boundary, nothing above it.

``FakeTrio.install(monkeypatch)`` replaces ``httpx.AsyncHTTPTransport.handle_async_request``
(the last step before a socket) with ``FakeTrio.handle``, which answers pytrio's Control REST
calls (``<base>/api/...``: API-key check, SDK bootstrap, service session, training and
sampling runs, checkpoint lookup, telemetry) and its Actor protocol (``<actor>/v1/...``:
MessagePack event envelopes for init / forward_backward / optim_step / save, JSON sampling,
heartbeats) in the shapes of pytrio 0.2.9's protocol models. Every pytrio client, builder,
validator, coordinator and codec above the transport runs for real, and what they send is
recorded decoded: ``training_runs`` / ``sampling_runs`` (Control bodies), ``events``
(Actor envelopes), ``samples`` (sampling requests).

``model_id`` is what Control resolves the base model to: tests point it at a local tokenizer
folder, because pytrio loads ``get_tokenizer(model_id)`` to bound-check token ids.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable

import httpx
import msgpack
import numpy as np
from pytrio.protocol.actor.events.tensor import WireTensorData

CONTROL = "http://trio.test"
ACTOR = "http://actor.test"
FAR_FUTURE = "2099-01-01T00:00:00Z"
NOW = "2026-01-01T00:00:00Z"

#: A sampling policy: (prompt tokens, sample index) -> reply tokens (incl. any stop token).
Policy = Callable[[list[int], int], list[int]]


class FakeTrio:
    """PyTRIO Control + one Actor, in process. See the module docstring."""

    def __init__(self, model_id: str, limits: dict | None = None, policy: Policy | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.model_id = model_id
        self.limits = limits or {"max_batch_size": 32, "max_tokens_per_request": 64_000,
                                 "max_seq_len": 8192}
        self.policy = policy or (lambda prompt, i: [prompt[-1]])
        self.decode = decode or (lambda tokens: " ".join(map(str, tokens)))
        self.reject_key = False  # answer the API-key check with HTTP 401
        self.unreachable = False  # every request fails to connect
        self.requests: list[tuple[str, str]] = []
        self.training_runs: list[dict] = []
        self.sampling_runs: list[dict] = []
        self.events: list[dict] = []
        self.samples: list[dict] = []
        self.unexpected: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def install(self, monkeypatch) -> FakeTrio:
        fake = self

        async def handle_async_request(transport, request: httpx.Request) -> httpx.Response:
            return await fake.handle(request)

        monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", handle_async_request)
        return self

    def events_of(self, kind: str) -> list[dict]:
        """Payloads of recorded Actor events of type ``kind`` (e.g. ``trainer.optimize_step``)."""
        return [e["payload"] for e in self.events if e["type"] == kind]

    # ------------------------------------------------------------------ routing

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.unreachable:
            raise httpx.ConnectError("connection refused", request=request)
        body = await request.aread()
        path = request.url.path
        with self._lock:
            self.requests.append((request.method, f"{request.url.host}{path}"))
        if request.url.host == "trio.test":
            return self._control(request.method, path.removeprefix("/api/"), body)
        if request.url.host == "actor.test":
            return self._actor(request.method, path.removeprefix("/"), body)
        return self._unexpected(request.method, str(request.url))

    def _unexpected(self, method: str, what: str) -> httpx.Response:
        self.unexpected.append(f"{method} {what}")
        return httpx.Response(404, json={"code": "not_found", "message": what})

    def _control(self, method: str, path: str, body: bytes) -> httpx.Response:
        if path == "openapi/v1/api-key/verify":
            return self._verify()
        if path == "sdk/bootstrap":
            return httpx.Response(200, json={"compatibility": {"status": "compatible",
                                                               "sdk_version": "0.2.9"},
                                             "notices": []})
        if path == "openapi/v1/service-sessions" and method == "POST":
            return httpx.Response(200, json={"service_session_cuid": "ss_1", "status": "ACTIVE",
                                             "workspace_cuid": "ws_1", "created_at": NOW})
        if path.endswith("/close") or path == "telemetry/event":
            return httpx.Response(200, json={})
        if path.endswith("/training-runs") and method == "POST":
            return self._create_run("training", json.loads(body))
        if path.endswith("/sampling-runs") and method == "POST":
            return self._create_run("sampling", json.loads(body))
        if path == "openapi/v1/training-runs/by-checkpoint-uri":
            return httpx.Response(200, json={"base_model": self.model_id, "lora_rank": 32,
                                             "seed": 0, "train_mlp": True, "train_attn": True,
                                             "train_unembed": True})
        return self._unexpected(method, f"control {path}")

    def _verify(self) -> httpx.Response:
        if self.reject_key:
            return httpx.Response(401, json={"code": "unauthorized", "message": "invalid API key"})
        return httpx.Response(200, json={
            "api_key_tid": "k1", "api_key_name": None, "user_cuid": "u1", "username": "lab",
            "display_name": None, "workspace_cuid": "ws_1", "workspace_name": "lab",
            "workspace_type": "PERSONAL", "expires_at": None})

    def _create_run(self, kind: str, body: dict) -> httpx.Response:
        n = next(self._ids)
        (self.training_runs if kind == "training" else self.sampling_runs).append(body)
        key = "trainer" if kind == "training" else "sampler"
        return httpx.Response(200, json={
            f"{kind}_run_cuid": f"{kind[0]}r_{n}", "service_session_cuid": "ss_1",
            "workspace_cuid": "ws_1", "status": "RUNNING", "run_index": n,
            "model_spec_cuid": "spec_1", "model_alias": self.model_id, "model_id": self.model_id,
            key: self.limits, "created_at": NOW,
            "actor": {"actor_cuid": "actor_1", "endpoint": ACTOR, "connect_mode": "direct",
                      "tls_enabled": False},
            "actor_jwt": {"token": f"jwt-{n}", "expires_at": FAR_FUTURE}})

    # ------------------------------------------------------------------- actor

    def _actor(self, method: str, path: str, body: bytes) -> httpx.Response:
        if path == "v1/events" and method == "POST":
            return self._event(msgpack.unpackb(body, raw=False))
        if path == "v1/client/heartbeat":
            return httpx.Response(200, json={"heartbeat_ms": 3_600_000})
        if path.startswith("v1/sampling-runs/") and path.endswith("/sample"):
            return self._sample(json.loads(body))
        return self._unexpected(method, f"actor {path}")

    def _event(self, envelope: dict) -> httpx.Response:
        with self._lock:
            self.events.append(envelope)
        kind, payload = envelope["type"], envelope["payload"]
        if kind in ("trainer.forward_backward", "trainer.forward"):
            result = self._forward_result(payload)
        elif kind == "trainer.optimize_step":
            result = {"metrics": {"grad_norm": 0.5}}
        elif kind in ("trainer.save_state", "trainer.save_weights"):
            run = envelope["metadata"]["run_id"]
            result = {"checkpoint": {"uri": f"trio://{run}/{kind.split('.')[1]}/{payload['name']}",
                                     "model_id": self.model_id, "size_bytes": 1024}}
        else:
            result = {}
        reply = {"version": 1, "event_id": envelope["event_id"], "type": kind,
                 "status": "succeeded", "result": result,
                 "usage": {"input_tokens": 0, "output_tokens": 0}}
        return httpx.Response(200, content=msgpack.packb(reply, use_bin_type=True),
                              headers={"content-type": "application/msgpack"})

    def _forward_result(self, payload: dict) -> dict:
        """Per datum a logprob of −0.5 for every position; sums over the active targets."""
        outputs, active = [], 0
        for datum in payload["data"]:
            n = len(datum["target_ids"])
            outputs.append({"logprobs": WireTensorData.from_numpy(
                np.full(n, -0.5, dtype=np.float32)).to_wire_value()})
            active += sum(t != -100 for t in datum["target_ids"])
        return {"loss_fn_outputs": outputs,
                "metrics": {"loss_sum": 0.5 * active, "loss_mean": 0.5, "token_count": active}}

    def _sample(self, request: dict) -> httpx.Response:
        with self._lock:
            self.samples.append(request)
        prompt = [t for chunk in request["prompt"]["chunks"] for t in chunk["tokens"]]
        seqs = []
        for i in range(request["num_samples"]):
            tokens = self.policy(prompt, i)
            seqs.append({"tokens": tokens, "text": self.decode(tokens),
                         "logprobs": [-0.25] * len(tokens), "stop_reason": "stop"})
        reply = {"request_id": request["request_id"], "sequences": seqs,
                 "usage": {"input_tokens": len(prompt), "output_tokens": 0}}
        if request.get("return_prompt_logprobs"):
            reply["prompt_logprobs"] = [None] + [-0.1] * (len(prompt) - 1)
        return httpx.Response(200, json=reply)
