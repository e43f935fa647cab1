"""The search circuit breaker: scripted metric sequences, quota exhaustion, the trainer hook."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from searchr1.loop.breaker import CircuitBreaker, SearchOutage, quota_exhausted
from searchr1.loop.checkpoint import newest_state
from searchr1.main import report_stop, resume_command
from searchr1.retrievers.base import Retriever, SearchError
from searchr1.retrievers.zhihu_keys import KeyPool
from searchr1.loop.config import BreakerConfig


def step(requests: float, error_rate: float) -> dict[str, float]:
    return {"search/step_requests": requests, "search/step_error_rate": error_rate}


def feed(breaker: CircuitBreaker, steps) -> list[str | None]:
    return [breaker.observe(m) for m in steps]


def test_defaults_are_window_5_threshold_half_grace_2():
    cfg = BreakerConfig()
    assert (cfg.window, cfg.threshold, cfg.grace_steps, cfg.enabled) == (5, 0.5, 2, True)


def test_trips_after_the_grace_period_not_before():
    out = feed(CircuitBreaker(BreakerConfig()), [step(10, 1.0)] * 4)
    assert out[:2] == [None, None]  # two bad steps are tolerated (grace_steps=2)
    assert out[2] is not None and "search outage" in out[2] and "100%" in out[2]


def test_at_the_threshold_trips_just_below_does_not():
    at = feed(CircuitBreaker(BreakerConfig(window=1)), [step(10, 0.5)] * 3)
    below = feed(CircuitBreaker(BreakerConfig(window=1)), [step(10, 0.4)] * 10)
    assert at[:2] == [None, None] and at[2] is not None
    assert below == [None] * 10


def test_rate_is_over_the_window_weighted_by_requests():
    b = CircuitBreaker(BreakerConfig(window=3, grace_steps=0))
    # 2 errors of 20, then 9 of 10: window rate 11/30 < 0.5 although the last step is 90%
    assert feed(b, [step(20, 0.1), step(10, 0.9)]) == [None, None]
    assert b.rate == pytest.approx(11 / 30)
    # one more 100% step of 10: 21/40 >= 0.5 → trips at once with no grace
    assert b.observe(step(10, 1.0)) is not None


def test_recovers_when_the_rate_drops():
    b = CircuitBreaker(BreakerConfig(window=1, grace_steps=2))
    assert feed(b, [step(10, 1.0), step(10, 1.0)]) == [None, None]
    assert b.over_steps == 2
    assert b.observe(step(10, 0.0)) is None and b.over_steps == 0  # healthy step resets
    # the grace period starts over: two more bad steps are tolerated again
    assert feed(b, [step(10, 1.0), step(10, 1.0)]) == [None, None]
    assert b.observe(step(10, 1.0)) is not None


def test_window_slides_old_failures_out():
    b = CircuitBreaker(BreakerConfig(window=2, threshold=0.6, grace_steps=1))
    assert feed(b, [step(10, 1.0), step(10, 0.0), step(10, 0.0)]) == [None, None, None]
    assert b.rate == 0.0  # the failing step left the window


def test_steps_without_searches_are_no_evidence():
    b = CircuitBreaker(BreakerConfig(grace_steps=0))
    assert feed(b, [{}, step(0, 0.0), {"reward/mean": 0.0}]) == [None, None, None]


def test_quota_exhaustion_trips_at_once():
    b = CircuitBreaker(BreakerConfig(grace_steps=5))
    assert b.observe(step(10, 0.0)) is None
    reason = b.observe(step(10, 0.0), quota_exhausted=True)
    assert reason is not None and "quota" in reason


def test_disabled_never_trips():
    b = CircuitBreaker(BreakerConfig(enabled=False, grace_steps=0))
    assert feed(b, [step(10, 1.0)] * 5) == [None] * 5
    assert b.observe(step(10, 1.0), quota_exhausted=True) is None


def test_backoff_doubles_while_over_and_resets():
    b = CircuitBreaker(BreakerConfig(window=1, grace_steps=3, backoff_s=0.5))
    assert b.pause_s == 0.0
    pauses = []
    for _ in range(3):
        b.observe(step(4, 1.0))
        pauses.append(b.pause_s)
    assert pauses == [0.5, 1.0, 2.0]
    b.observe(step(4, 0.0))
    assert b.pause_s == 0.0


@pytest.mark.parametrize("bad", [dict(window=0), dict(threshold=0.0), dict(threshold=1.5),
                                 dict(grace_steps=-1), dict(backoff_s=-1.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="trainer.breaker"):
        CircuitBreaker(BreakerConfig(**bad))


def test_quota_exhausted_reads_only_the_declared_property():
    from searchr1.retrievers.base import Retriever

    class Keyless(Retriever):  # the base class declares it: a retriever without keys never exhausts
        async def _search(self, queries, topk):
            return [[] for _ in queries]

    class Flagged(Keyless):
        def __init__(self, flag):
            super().__init__()
            self.flag = flag

        @property
        def quota_exhausted(self):
            return self.flag

    class PrivatePool(Keyless):  # what the breaker used to read: no longer looked at
        def __init__(self):
            super().__init__()
            self._pool = KeyPool(["k0"])
            self._pool.retire(self._pool._keys[0])

    assert quota_exhausted(Flagged(True)) and not quota_exhausted(Flagged(False))
    assert not quota_exhausted(Flagged("yes"))  # only a real bool counts
    assert not quota_exhausted(Keyless())
    assert not quota_exhausted(PrivatePool())


async def test_quota_exhausted_sees_a_zhihu_retriever_through_the_search_cache(tmp_path):
    from searchr1.retrievers.cache import CachedRetriever
    from searchr1.retrievers.zhihu import ZhihuConfig, ZhihuRetriever
    from tests.helpers.fake_zhihu import QUOTA, FakeZhihu, FaultPlan

    with FakeZhihu(FaultPlan(quota_after=1)) as server:  # one answer, then Code 30002
        zhihu = ZhihuRetriever(ZhihuConfig(base_url=server.url, backoff_s=0.01), keys=["k0", "k1"])
        cached = CachedRetriever(zhihu, tmp_path / "cache.sqlite", "fingerprint")
        assert not zhihu.quota_exhausted and not quota_exhausted(cached)
        assert (await cached.search(["first"], 3))[0]  # answered: keys still live
        assert not quota_exhausted(cached)
        with pytest.raises(SearchError, match="retired"):
            await cached.search(["second"], 3)  # 30002 retires one key, then the other
        await cached.aclose()
    assert server.served[QUOTA] == 2
    assert zhihu.quota_exhausted and quota_exhausted(zhihu) and quota_exhausted(cached)


def test_report_writes_the_reason_and_a_resume_command(tmp_path, capsys):
    err = SearchOutage("search outage: 100%", 3, {"steps": 3.0})
    text = report_stop(err, tmp_path, ["trainer.steps=9", "trainer.resume=never",
                                       "retriever=zhihu"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"steps": 3.0, "stopped_reason": "search outage: 100%"}
    cmd = resume_command(tmp_path, ["trainer.steps=9", "trainer.resume=never", "retriever=zhihu"])
    assert cmd == (f"uv run python -m searchr1.main trainer.resume=auto hydra.run.dir={tmp_path} "
                   f"trainer.steps=9 retriever=zhihu")
    assert cmd in text and "\n" not in text  # one paragraph
    assert capsys.readouterr().err.strip() == text


# ----- the trainer hook, on the tiny model of tests/loop/test_trainer.py ---------------------------


class DownRetriever(Retriever):
    """Every search fails after 'retries' (or, once ``up``, returns one document)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False

    async def _search(self, queries, topk):
        from searchr1.retrievers.base import Document

        if not self.up:
            raise SearchError("backend down")
        return [[Document(id=f"d{i}", title=q, text=q)] for i, q in enumerate(queries)]


def search_protocol(tokenizer):
    from searchr1.protocols.base import Action, ActionKind
    from tests.loop.test_trainer import TextProtocol

    class SearchThenAnswer(TextProtocol):
        """Every turn searches its own text (a non-empty query); observations via the tokenizer."""

        def parse_action(self, text):
            return Action(ActionKind.SEARCH, query="q " + text)

        def observation_tokens(self, sampled, observation, max_tokens):
            text = "[error]" if observation.error else "[ok]"
            return self.tok.encode(text, add_special_tokens=False)[:max_tokens], text

    return SearchThenAnswer(tokenizer)


def run_with(cfg, run_dir: Path, retriever):
    from searchr1.build import build_step_runner, loop_limits
    from searchr1.engines.local.service import LocalService
    from searchr1.loop.trainer import Trainer
    from searchr1.rollout.engine import RolloutEngine
    from tests.loop.test_trainer import ListTracker, dataset, vowel_reward

    service = LocalService(cfg.engine, cfg.model, run_dir, loop_limits(cfg.trainer))
    rollout = RolloutEngine(search_protocol(service.get_tokenizer()), retriever, 1, cfg.rollout)
    tracker = ListTracker()
    trainer = Trainer(cfg, run_dir, service, dataset(), rollout, vowel_reward, tracker,
                      build_runner=build_step_runner)
    return asyncio.run(trainer.run()), tracker


def test_trainer_checkpoints_and_stops_when_searches_keep_failing(tiny_model_dir, tmp_path):
    from tests.loop.test_trainer import make_cfg

    cfg = make_cfg(tiny_model_dir, steps=6)  # save_every=0: only the breaker checkpoints mid-run
    cfg.rollout.max_turns = 2
    retriever = DownRetriever()
    with pytest.raises(SearchOutage) as info:
        run_with(cfg, tmp_path, retriever)
    assert info.value.step == 3  # two bad steps tolerated, the third trips
    assert "search outage" in info.value.reason and info.value.summary["steps"] == 3.0
    state = newest_state(tmp_path)
    assert state is not None and state.step == 3 and state.cursor == 6
    # search works again: trainer.resume=auto continues at step 4 and finishes
    retriever.up = True
    cfg.trainer.resume = "auto"
    final, tracker = run_with(cfg, tmp_path, retriever)
    assert [s for s, m in tracker.rows if "reward/mean" in m] == [4, 5, 6]
    assert final["steps"] == 6.0


# ----- main.py: exit code 3 for one job, the next job of a sweep still runs -------------------

FAKE_MAIN = """
import runpy
from pathlib import Path
from types import SimpleNamespace
import searchr1.build as v
import searchr1.loop.trainer as t
from searchr1.loop.breaker import SearchOutage

class FakeTrainer:  # the breaker tripped after step 2 (no model: fast)
    def __init__(self, cfg, run_dir, *a, **kw):
        self.run_dir = Path(run_dir)
    async def run(self):
        (self.run_dir / "ran").write_text("1")
        raise SearchOutage("search outage: scripted", 2, {"steps": 2.0})

v.build_app_or_exit = lambda cfg, run_dir, dp=None: SimpleNamespace(
    service=None, dataset=None, rollout=None, reward_fn=None)
t.Trainer = FakeTrainer
runpy.run_module("searchr1.main", run_name="__main__", alter_sys=True)
"""


def _fake_main(args):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-c", FAKE_MAIN, *args], cwd=root,
                          capture_output=True, text=True, timeout=300)


def test_main_exits_3_with_the_reason_and_the_resume_command(tmp_path):
    from searchr1.loop.breaker import EXIT_SEARCH_OUTAGE

    run = tmp_path / "run"
    out = _fake_main([f"hydra.run.dir={run}", "trainer.steps=4", "trainer.resume=never"])
    assert out.returncode == EXIT_SEARCH_OUTAGE == 3, out.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_reason"] == "search outage: scripted"
    cmd = f"python -m searchr1.main trainer.resume=auto hydra.run.dir={run} trainer.steps=4"
    assert cmd in out.stderr and "Traceback" not in out.stderr


def test_a_sweep_goes_on_with_the_next_job(tmp_path):
    out = _fake_main(["-m", f"hydra.sweep.dir={tmp_path}", "trainer.steps=4,5"])
    assert out.returncode != 0  # the sweep reports the failed jobs at its end
    for job, steps in (("0", 4), ("1", 5)):
        assert (tmp_path / job / "ran").exists()  # the second job ran after the first tripped
        assert "stopped_reason" in json.loads((tmp_path / job / "summary.json").read_text())
        assert f"hydra.run.dir={tmp_path / job} trainer.steps={steps}" in out.stderr
