"""``trainer.max_staleness``: rollouts overlapping training, on the fake PyTRIO server.

``TimedTrio`` is ``tests/helpers/trio_fake.py``'s server with a latency per request kind (sampling,
forward_backward, optim_step) and a timeline of what arrived when: each request's start and
end, the optimizer version (optim_steps answered) at that moment, and for a sampling
request the version of the weights its sampling run was created from (the
``save_weights`` event behind the run's ``source_checkpoint_uri``). Everything above the
transport is pytrio's own client code, as in ``tests/engines/test_trio.py``.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import msgpack
import pytest
from transformers import AutoTokenizer

from searchr1.data.types import Dataset, QAExample
from searchr1.loop.checkpoint import resolve_resume
from searchr1.build import build_step_runner
from searchr1.loop.trainer import Trainer
from searchr1.protocols.tool_call import ToolCallProtocol
from searchr1.rewards import RewardConfig, build_reward
from searchr1.rollout.engine import RolloutEngine
from searchr1.advantages.config import AdvantageConfig
from tests.helpers.rollout_fakes import SlowRetriever
from tests.engines.test_trio import engine_cfg, lab_policy, lab_run_cfg, model_cfg, tok_dir  # noqa: F401
from tests.helpers.trio_fake import FakeTrio

OPTIM = "trainer.optimize_step"
FB = "trainer.forward_backward"


class TimedTrio(FakeTrio):
    """FakeTrio with per-kind latency and a timeline (see the module docstring)."""

    def __init__(self, *args, delays: dict[str, float] | None = None, **kw) -> None:
        super().__init__(*args, **kw)
        self.delays = delays or {}  # "sample" | an Actor event type -> seconds
        self.timeline: list[dict] = []
        self.version = 0  # optim_steps answered so far
        self.weights_version: dict[str, int] = {}  # save_weights name -> version when saved
        self.run_weights: dict[str, str] = {}  # sampling run id -> save_weights name

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = await request.aread()
        kind, info = None, {}
        if path.endswith("/sample"):
            kind = "sample"
            run = path.split("/")[-2]
            info = {"run": run, "weights": self.weights_version.get(self.run_weights.get(run, ""), -1)}
        elif path == "/v1/events":
            env = msgpack.unpackb(body, raw=False)
            kind = env["type"]
            if kind == "trainer.save_weights":
                self.weights_version[env["payload"]["name"]] = self.version
        if kind is None:
            return await super().handle(request)
        entry = {"kind": kind, "start": time.perf_counter(), "version": self.version, **info}
        self.timeline.append(entry)
        await asyncio.sleep(self.delays.get(kind, 0.0))
        response = await super().handle(request)
        if kind == OPTIM:
            self.version += 1
        entry["end"] = time.perf_counter()
        return response

    def _create_run(self, kind: str, body: dict) -> httpx.Response:
        response = super()._create_run(kind, body)
        if kind == "sampling" and body.get("source_checkpoint_uri"):
            run = json.loads(response.content)["sampling_run_cuid"]
            self.run_weights[run] = body["source_checkpoint_uri"].rsplit("/", 1)[-1]
        return response

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.timeline if e["kind"] == kind]


class RecordingTracker:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def train_metrics(self) -> list[dict]:
        return [m for _, m in self.logged if "train/staleness" in m]


@pytest.fixture()
def timed(monkeypatch, tok_dir):  # noqa: F811
    from pytrio.config.config import auth_state

    monkeypatch.setattr(auth_state, "api_key", "sk-test")
    monkeypatch.setattr(auth_state, "config_error", None)
    server_tok = AutoTokenizer.from_pretrained(tok_dir)
    f = TimedTrio(str(tok_dir), decode=lambda t: server_tok.decode(t, skip_special_tokens=False),
                  delays={"sample": 0.05, FB: 0.1, OPTIM: 0.3})
    f.policy = lab_policy(server_tok)
    yield f.install(monkeypatch)
    assert not f.unexpected, f.unexpected


def run_trainer(fake, tok_dir, tmp_path, staleness: int, steps: int = 3):  # noqa: F811
    from searchr1.engines.trio import TrioService
    cfg = lab_run_cfg(2, 256, steps=steps, questions_per_step=2, max_staleness=staleness)
    qs = [QAExample(id=f"q{i}", question="What is the capital of France?",
                    golden_answers=("Paris",), data_source="nq") for i in range(4)]
    rollout = RolloutEngine(ToolCallProtocol(AutoTokenizer.from_pretrained(tok_dir)),
                            SlowRetriever(delay=0.0), 3, cfg.rollout)
    service = TrioService(engine_cfg(), model_cfg(), tmp_path)
    tracker = RecordingTracker()
    try:
        trainer = Trainer(cfg, tmp_path, service, Dataset(qs, qs[:1], []), rollout,
                          build_reward(RewardConfig(name="em_format")), tracker,
                          build_runner=build_step_runner)
        summary = asyncio.run(trainer.run())
    finally:
        service.close()
    return summary, tracker


def _during(events: list[dict], window: dict) -> list[dict]:
    return [e for e in events if window["start"] < e["start"] < window["end"]]


def test_staleness_0_is_strictly_sequential(timed, tok_dir, tmp_path):  # noqa: F811
    summary, tracker = run_trainer(timed, tok_dir, tmp_path, staleness=0)

    assert summary["steps"] == 3.0
    optims, samples = timed.of(OPTIM), timed.of("sample")
    assert len(optims) == 3
    for fb, opt in zip(timed.of(FB), optims):  # nothing is sampled while a step trains
        assert not _during(samples, {"start": fb["start"], "end": opt["end"]})
    # every sample is on the weights current when it is sent
    assert samples and all(s["weights"] == s["version"] for s in samples)
    # step k's samples all come after step k-1's optim_step and before step k's
    bounds = [0.0] + [o["end"] for o in optims]
    per_step = [[s for s in samples if lo < s["start"] < hi] for lo, hi in zip(bounds, bounds[1:])]
    assert all(per_step) and [{s["weights"] for s in g} for g in per_step] == [{0}, {1}, {2}]
    assert [m["train/staleness"] for m in tracker.train_metrics()] == [0.0, 0.0, 0.0]


def test_staleness_1_samples_the_next_step_while_this_one_trains(timed, tok_dir, tmp_path):  # noqa: F811
    summary, tracker = run_trainer(timed, tok_dir, tmp_path, staleness=1)

    assert summary["steps"] == 3.0 and summary["trained_tokens"] > 0
    optims, samples = timed.of(OPTIM), timed.of("sample")
    assert len(optims) == 3
    # step k+1's sampling is sent before step k's optim_step returns (k = 0, 1), from the
    # weights before step k's update
    for k in (0, 1):
        overlapped = _during(samples, {"start": timed.of(FB)[k]["start"], "end": optims[k]["end"]})
        assert overlapped and {s["weights"] for s in overlapped} == {k}
    # no rollout samples weights older than one optimizer step
    assert samples and all(0 <= s["version"] - s["weights"] <= 1 for s in samples)
    # the last step launches no extra rollout: training samplers are versions 0, 0, 1
    # (step 0 and 1 launched before any update / before step 1's), then the final eval's
    trained = sorted({s["weights"] for s in samples if s["start"] < optims[-1]["start"]})
    assert trained == [0, 1]
    assert not [s for s in samples if s["start"] > optims[-1]["end"] and s["weights"] != 3]
    assert [m["train/staleness"] for m in tracker.train_metrics()] == [0.0, 1.0, 1.0]
    state = resolve_resume("auto", tmp_path)
    assert state.step == 3 and state.optimizer_steps == 3


def test_staleness_other_than_0_or_1_is_refused(timed, tok_dir, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="max_staleness"):
        run_trainer(timed, tok_dir, tmp_path, staleness=2)


# ------------------------------------------------- the local engine: to_thread, resume, eval


def test_local_engine_overlaps_saves_evaluates_and_resumes(tiny_model_dir, tmp_path):
    from tests.loop.test_trainer import make_cfg, run_trainer as run_local, train_rows

    cfg = make_cfg(tiny_model_dir, steps=3, save_every=1, eval_every=1, max_staleness=1)
    final, tracker, _ = run_local(cfg, tmp_path / "a")
    rows = train_rows(tracker)
    assert [s for s, _ in rows] == [1, 2, 3] and final["steps"] == 3.0
    assert [m["train/staleness"] for _, m in rows] == [0.0, 1.0, 1.0]
    assert all(m["train/datums"] > 0 and m["train/optimizer_steps"] == 1 for _, m in rows)
    assert sorted(p.name for p in (tmp_path / "a/checkpoints").glob("step_*")) == [
        "step_000001", "step_000002", "step_000003"]
    assert (tmp_path / "a/eval/step_000002/trajectories.jsonl").exists()  # eval between steps
    state = resolve_resume("auto", tmp_path / "a")
    assert (state.step, state.cursor, state.optimizer_steps) == (3, 6, 3)

    # a run stopped after step 2 resumes at step 3, on-policy, with the same data cursor
    run_local(make_cfg(tiny_model_dir, steps=2, save_every=1, max_staleness=1), tmp_path / "b")
    resumed = make_cfg(tiny_model_dir, steps=3, save_every=1, max_staleness=1, resume="auto")
    _, res_tracker, _ = run_local(resumed, tmp_path / "b")
    res_rows = train_rows(res_tracker)
    assert [s for s, _ in res_rows] == [3] and res_rows[0][1]["train/staleness"] == 0.0
    state = resolve_resume("auto", tmp_path / "b")
    assert (state.step, state.cursor, state.optimizer_steps) == (3, 6, 3)


def test_local_engine_offloads_scoring_critic_and_kl(tiny_model_dir, tmp_path):
    """The offloaded (worker-thread) scoring paths: recomputed old log-probs, reference
    log-probs for KL, and the critic's values and update."""
    from searchr1.losses.config import KLConfig, LossConfig
    from searchr1.advantages.config import CriticConfig
    from tests.loop.test_trainer import make_cfg, run_trainer as run_local, train_rows

    cfg = make_cfg(tiny_model_dir, steps=2, max_staleness=1)
    cfg.advantage = AdvantageConfig(name="ppo_gae")
    cfg.critic = CriticConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-2, warmup_ratio=0.0,
                              device="cpu")
    cfg.loss = LossConfig(name="ppo", old_logprobs="recompute", kl=KLConfig(coef=0.01))
    cfg.rollout.group_size = 1
    _, tracker, _ = run_local(cfg, tmp_path)
    rows = [m for _, m in train_rows(tracker)]
    assert [m["train/staleness"] for m in rows] == [0.0, 1.0]
    assert all("train/kl_sampled" in m and "critic/value_loss" in m for m in rows)
    assert rows[1]["critic/values_mean"] != 0.0  # the critic trained in the worker thread
