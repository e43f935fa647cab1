"""The fault matrix of issue 13 on a loopback fake Zhihu server (``searchr1/testing/``).

The server is real HTTP on 127.0.0.1 and the client is the real ``ZhihuRetriever`` (retries,
key rotation, timeouts), keys only in ``$ZHIHU_SEARCH_KEYS`` (canary strings). Which query
failed is read from the server's own log, never from the client, and what was trained is
read from the datums handed to the training client: so "0 trained datums from failed
searches" is checked end to end. Failures at 100% and a quota running out go through
``python -m searchr1.main`` (exit code, resume hint, ``summary.json``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from searchr1.loop.breaker import EXIT_SEARCH_OUTAGE, quota_exhausted
from searchr1.retrievers.base import SearchError
from searchr1.retrievers.zhihu import ZhihuConfig, ZhihuRetriever
from tests.helpers.fake_zhihu import (
    EMPTY, HTTP_429, HTTP_500, MALFORMED, MIXED, OK, QUOTA, REFUSED, TIMEOUT, FakeZhihu, FaultPlan,
)
from tests.helpers.fault_run import (
    CANARY_KEYS, GRACE_STEPS, KEYS_ENV, SEARCHES_PER_STEP, canary_hits,
    main_overrides, run_in_process, start_mains,
)

SEED = 3  # a seed whose 3 steps draw every kind of fault (the draws follow the sampler's)

# ---- the fake server, through the real client (no model) -----------------------------------


def test_fault_plan_is_a_pure_function_of_seed_and_query():
    plan = FaultPlan(rate=0.2, seed=SEED)
    queries = [f"query {i}" for i in range(1000)]
    kinds = [plan.fault_for(q) for q in queries]
    assert kinds == [FaultPlan(rate=0.2, seed=SEED).fault_for(q) for q in queries]
    assert kinds != [FaultPlan(rate=0.2, seed=SEED + 1).fault_for(q) for q in queries]
    faulted = [k for k in kinds if k != OK]
    assert 150 < len(faulted) < 250 and set(faulted) == set(MIXED)
    assert {FaultPlan(rate=0.0).fault_for(q) for q in queries} == {OK}
    assert OK not in {FaultPlan(rate=1.0).fault_for(q) for q in queries}


def _client(server: FakeZhihu, **cfg) -> ZhihuRetriever:
    fields = {"base_url": server.url, "timeout_s": 0.3, "max_retries": 1, "backoff_s": 0.01,
              "default_retry_after_s": 0.0, **cfg}
    return ZhihuRetriever(ZhihuConfig(**fields), keys=list(CANARY_KEYS))


async def _search(server: FakeZhihu, queries: list[str], **cfg):
    """Each query alone through a fresh client: documents, or the SearchError's text."""
    client = _client(server, **cfg)
    out = []
    for q in queries:
        try:
            out.append((await client.search([q], 3))[0])
        except SearchError as err:
            out.append(str(err))
    await client.aclose()
    return out, client


@pytest.mark.parametrize("kind,attempts,error", [
    (TIMEOUT, 2, "timed out"), (HTTP_500, 2, "HTTP 500"), (HTTP_429, 5, "rate-limited"),
    (MALFORMED, 1, "malformed JSON"), (EMPTY, 1, None), (QUOTA, 2, "retired"),
])
async def test_each_fault_reaches_the_client_as_the_real_api_would(kind, attempts, error):
    with FakeZhihu(FaultPlan(rate=1.0, kinds=(kind,), timeout_sleep_s=1.0)) as server:
        [result], client = await _search(server, ["capital of japan"])
    assert server.outcomes("capital of japan") == [kind] * attempts  # sticky: retries fail too
    assert server.failed_queries() == {"capital of japan"}
    if error is None:
        assert result == []  # empty results: a failure where results are promised
    else:
        assert isinstance(result, str) and error in result
        assert not any(k in result for k in CANARY_KEYS)
    assert client.quota_exhausted is (kind == QUOTA)


async def test_success_echoes_the_query_then_quota_runs_out_after_n_answers():
    passages = ["Tokyo is the capital of Japan.", "Paris is in France."]
    with FakeZhihu(FaultPlan(quota_after=2), passages=passages) as server:
        results, client = await _search(server, ["capital of japan", "paris", "third"])
    first, second, third = results
    assert first[0].text == "capital of japan" and first[1].text == passages[0]
    assert second[0].text == "paris" and second[1].text == passages[1]
    assert isinstance(third, str) and "retired" in third
    assert server.served == {OK: 2, QUOTA: 2}  # the third query retired both keys
    assert client.quota_exhausted and quota_exhausted(client)


async def test_the_server_stops_by_itself_after_max_requests():
    with FakeZhihu(FaultPlan(max_requests=2)) as server:
        results, _ = await _search(server, ["a", "b", "c", "d"], timeout_s=2.0)
        for _ in range(100):  # the server exits on its own
            if not server.running:
                break
            await asyncio.sleep(0.05)
        assert not server.running
    assert [bool(r) and not isinstance(r, str) for r in results[:2]] == [True, True]
    assert all(isinstance(r, str) for r in results[2:])  # refused or no listener: no hang
    assert server.served[OK] == 2 and set(server.served) <= {OK, REFUSED}


# ---- 20% mixed faults through the real trainer ---------------------------------------------


def _mixed_run(policy: str, model_dir: Path, run_dir: Path, monkeypatch):
    monkeypatch.setenv(KEYS_ENV, ",".join(CANARY_KEYS))
    with FakeZhihu(FaultPlan(rate=0.2, seed=SEED)) as server:
        run = run_in_process(model_dir, run_dir, server, policy, steps=3)
    assert run.stopped is None and run.final["steps"] == 3.0  # the run completes
    assert set(server.faults_served()) == set(MIXED)  # every kind of fault was injected
    failed = run.failed_by_server(server)
    assert failed and run.trained  # some searches failed, and the run trained
    # counted independently: trajectories with a search the server never answered
    assert run.total("rollout/tool_error_trajectories") == len(failed)
    assert all(run.datum_sources())  # every trained datum is one of the step's trajectories
    assert canary_hits(run_dir) == []
    return run, server, failed


@pytest.mark.parametrize("policy", ["drop_group", "drop_trajectory"])
def test_mixed_faults_never_train_a_failed_search(policy, tiny_model_dir, tmp_path, monkeypatch):
    run, server, failed = _mixed_run(policy, tiny_model_dir, tmp_path, monkeypatch)
    assert run.trained_from_failed(server) == 0
    failed_ids = {id(t) for t in failed}
    groups = [g for step in run.groups for g in step]
    if policy == "drop_group":  # the whole group of each failed trajectory
        expected = sum(len(g) for g in groups if any(id(t) in failed_ids for t in g))
    else:
        expected = len(failed)
    assert run.total("train/dropped_for_tool_error") == expected > 0
    # search/success_rate (cumulative) counts empty results as failures
    executed = [q for t in run.trajectories for q in t.queries]
    answered = server.answered_queries()
    last = run.train_rows()[-1][1]
    assert last["search/requests"] == len(executed)
    rate = sum(q in answered for q in executed) / len(executed)
    assert last["search/success_rate"] == pytest.approx(rate)
    assert any(EMPTY in server.outcomes(q) for q in executed)  # empties were among them


def test_observe_trains_on_failed_searches(tiny_model_dir, tmp_path, monkeypatch):
    """The ablation: the same faults, and the failed trajectories do reach the update."""
    run, server, _ = _mixed_run("observe", tiny_model_dir, tmp_path, monkeypatch)
    assert run.total("train/dropped_for_tool_error") == 0
    assert run.trained_from_failed(server) > 0


# ---- outages through python -m searchr1.main -----------------------------------------------

#: multirun jobs, in sweep order: (name, fault plan)
SWEPT = [("http_429", FaultPlan(rate=1.0, kinds=(HTTP_429,))),
         ("quota", FaultPlan(rate=1.0, kinds=(QUOTA,))),
         ("quota_mid_run", FaultPlan(quota_after=SEARCHES_PER_STEP + 2))]


@pytest.fixture(scope="module", autouse=True)
def outage_runs(request, tiny_model_dir, tmp_path_factory):
    """100% HTTP 500 as one run (its exit code), and 429 / 30002 / quota running out mid-run
    as one Hydra multirun (one import for three jobs). Started when the module starts, when
    any selected test needs them, so they run while the in-process tests do."""
    if not any("outages" in item.fixturenames for item in request.session.items):
        yield None
        return
    root = tmp_path_factory.mktemp("outages")
    plans = [("http_500", FaultPlan(rate=1.0, kinds=(HTTP_500,))), *SWEPT]
    servers = {name: FakeZhihu(plan) for name, plan in plans}
    started = []
    try:
        for server in servers.values():
            server.__enter__()
        single = [f"hydra.run.dir={root / 'http_500'}",
                  *main_overrides(tiny_model_dir, servers["http_500"].url)]
        urls = ",".join(servers[name].url for name, _ in SWEPT)
        sweep = ["-m", f"hydra.sweep.dir={root / 'sweep'}", *main_overrides(tiny_model_dir, urls)]
        started = start_mains([single, sweep], root / "logs")
        yield root, servers, started
    finally:
        for m in started:
            m.kill()
        for server in servers.values():
            server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def outages(outage_runs):
    """The outage runs' results, once both processes have finished."""
    root, servers, started = outage_runs
    single, sweep = (m.wait(timeout=400) for m in started)
    dirs = {"http_500": root / "http_500",
            **{name: root / "sweep" / str(i) for i, (name, _) in enumerate(SWEPT)}}
    return {"single": single, "sweep": sweep, "servers": servers, "dirs": dirs, "root": root}


def _steps_done(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "reward/mean" in r]


def _resume_hint(text: str, run_dir: Path) -> bool:
    """Whether ``text`` holds the command that resumes the run in ``run_dir``."""
    command = f"python -m searchr1.main trainer.resume=auto hydra.run.dir={run_dir} "
    return command in text


def test_total_500s_exit_3_with_the_resume_command_within_the_grace_period(outages):
    out, run_dir = outages["single"], outages["dirs"]["http_500"]
    assert out.returncode == EXIT_SEARCH_OUTAGE == 3, out.stderr[-3000:]
    assert _resume_hint(out.stderr, run_dir) and "Traceback" not in out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "search outage" in summary["stopped_reason"]
    assert summary["steps"] == len(_steps_done(run_dir)) <= GRACE_STEPS + 1
    last = run_dir / "checkpoints" / f"step_{int(summary['steps']):06d}"
    assert (last / "trainer_state.json").exists()  # checkpointed before stopping
    assert set(outages["servers"]["http_500"].served) == {HTTP_500}


@pytest.mark.parametrize("name,reason", [("http_429", "search outage"),
                                         ("quota", "quota exhausted")])
def test_total_429s_and_quota_errors_stop_the_job_with_the_resume_command(outages, name, reason):
    out, run_dir = outages["sweep"], outages["dirs"][name]
    assert out.returncode != 0, out.stderr[-3000:]  # a sweep reports failed jobs at its end
    assert _resume_hint(out.stderr, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert reason in summary["stopped_reason"]
    assert summary["steps"] == len(_steps_done(run_dir)) <= GRACE_STEPS + 1
    if name == "quota":
        assert summary["steps"] == 1  # every key retired in step 1: trips at once, no grace


def test_quota_running_out_mid_run_stops_at_that_step(outages):
    run_dir, server = outages["dirs"]["quota_mid_run"], outages["servers"]["quota_mid_run"]
    assert _resume_hint(outages["sweep"].stderr, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "quota exhausted" in summary["stopped_reason"]
    # the step of the first Code 30002, from the server's log: one search per trajectory
    kinds = [kind for _, kind in server.log]
    ran_out = kinds.index(QUOTA) // SEARCHES_PER_STEP + 1
    assert ran_out == 2 and summary["steps"] == ran_out and _steps_done(run_dir) == [1, 2]


def test_keys_never_reach_a_run_file_or_the_output(outages):
    texts = [t for p in (outages["single"], outages["sweep"]) for t in (p.stdout, p.stderr)]
    assert canary_hits(outages["root"], texts) == []
    assert all(outages["servers"][n].served for n in outages["servers"])  # the keys were used
