"""ZhihuRetriever against a local HTTP server replaying Zhihu-style responses.

The server is pytest-httpserver's ``HTTPServer`` started with ``threaded=True`` (the stock
``httpserver`` fixture serves one request at a time, which would hide concurrency and make a
sleeping handler block the retry that should overtake it). A ``Script`` handler records the
``Authorization`` header of every request and replays its responses in order.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from searchr1.retrievers.base import SearchError
from searchr1.retrievers.zhihu import MissingCredentialsError, ZhihuConfig, ZhihuRetriever
from searchr1.retrievers.zhihu_keys import KEY_ENV_VARS, find_keys, parse_keys, read_dotenv

KEYS = ["zk-SECRET-alpha-7f3a9c1d", "zk-SECRET-bravo-52be07aa"]
PATH = "/api/v1/content/global_search"


def ok(*items: dict) -> Response:
    return reply({"Code": 0, "Message": "success", "Data": {"Items": list(items)}})


def reply(body: dict, status: int = 200, headers: dict | None = None) -> Response:
    body_text = json.dumps(body)
    return Response(body_text, status=status, headers=headers, content_type="application/json")


def item(title: str = "Tokyo", text: str = "Tokyo is the capital of Japan.", **extra) -> dict:
    base = {"Title": title, "ContentText": text, "Url": f"https://zhihu.com/q/{title}",
            "ContentType": "answer", "AuthorName": "Alice"}
    return {**base, **extra}


class Script:
    """Replays ``steps`` in order (the last one repeats); records each request's key."""

    def __init__(self, *steps) -> None:
        self.steps = list(steps)
        self.auth: list[str] = []
        self.args: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Response:
        with self.lock:
            self.auth.append(request.headers.get("Authorization", ""))
            self.args.append(dict(request.args))
            step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        return step if isinstance(step, Response) else step(request)

    def keys_used(self) -> list[int]:
        return [KEYS.index(a.removeprefix("Bearer ")) for a in self.auth]


@pytest.fixture(scope="module")
def server():
    srv = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    srv.start()
    yield srv
    srv.clear()
    srv.stop()


@pytest.fixture
async def make(server):
    """``make(script, **cfg)`` → a retriever talking to ``server`` with both test keys."""
    made: list[ZhihuRetriever] = []

    def factory(script: Script, keys: list[str] = KEYS, max_concurrency: int | None = None,
                **overrides) -> ZhihuRetriever:
        server.clear_all_handlers()
        server.expect_request(PATH).respond_with_handler(script)
        fields = {"base_url": f"http://127.0.0.1:{server.port}", "backoff_s": 0.01, **overrides}
        cfg = ZhihuConfig(**fields)
        made.append(ZhihuRetriever(cfg, keys=keys, max_concurrency=max_concurrency))
        return made[-1]

    yield factory
    for retriever in made:
        await retriever.aclose()


# ---- success --------------------------------------------------------------------------------


async def test_success_maps_items_and_truncates(make):
    long = "x" * 3000
    script = Script(ok(item(text=long), item("NoUrl", Url="", AuthorName=""), item("Third")))
    r = make(script)
    [docs] = await r.search(["capital of japan"], topk=2)
    assert len(docs) == 2
    first, second = docs
    assert first.title == "Tokyo" and first.text == "x" * 1200
    assert first.url == first.id == "https://zhihu.com/q/Tokyo"
    assert first.source == "zhihu/answer / Alice"
    assert second.url is None and second.id.startswith("zhihu:") and second.source == "zhihu/answer"
    assert script.args[0] == {"Query": "capital of japan", "Count": "2", "SearchDB": "all"}
    assert script.auth == [f"Bearer {KEYS[0]}"]
    m = r.metrics()
    assert m["search/success_rate"] == 1.0 and m["search/429_rate"] == 0.0


async def test_request_carries_unix_timestamp(make, server):
    stamps: list[int] = []

    def handler(request: Request) -> Response:
        stamps.append(int(request.headers["X-Request-Timestamp"]))
        return ok(item())

    r = make(Script(handler))
    await r.search(["q"], topk=3)
    assert abs(stamps[0] - time.time()) < 5


async def test_keys_rotate_round_robin(make):
    script = Script(ok(item()))
    r = make(script)
    for _ in range(4):
        await r.search(["q"], topk=1)
    assert script.keys_used() == [0, 1, 0, 1]


# ---- rate limits and quota ------------------------------------------------------------------


async def test_http_429_sets_key_aside_and_fails_over(make):
    script = Script(reply({"Code": 429}, status=429, headers={"Retry-After": "120"}), ok(item()))
    r = make(script)
    [docs] = await r.search(["q"], topk=3)
    assert docs and script.keys_used() == [0, 1]
    await r.search(["q"], topk=3)  # key 0 is still set aside
    assert script.keys_used() == [0, 1, 1]
    m = r.metrics()
    assert m["search/429_rate"] == 0.5 and m["search/credential_failover_rate"] == 0.5


async def test_code_30001_fails_over_like_429(make):
    script = Script(reply({"Code": 30001, "Message": "rate limited"}), ok(item()))
    r = make(script, default_retry_after_s=100.0)
    [docs] = await r.search(["q"], topk=3)
    assert docs and script.keys_used() == [0, 1]
    await r.search(["q"], topk=3)
    assert script.keys_used()[-1] == 1
    assert r.metrics()["search/429_rate"] == 0.5


async def test_waits_for_earliest_retry_after_within_bound(make):
    limited = reply({"Code": 30001}, headers={"Retry-After": "0.3"})
    script = Script(limited, limited, ok(item()))
    r = make(script, max_key_wait_s=5.0)
    start = time.perf_counter()
    [docs] = await r.search(["q"], topk=3)
    assert docs and time.perf_counter() - start >= 0.25
    assert script.keys_used() == [0, 1, 0]


async def test_code_30002_retires_key_for_the_run(make, caplog):
    script = Script(reply({"Code": 30002, "Message": "quota exhausted"}), ok(item()))
    r = make(script)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            await r.search(["q"], topk=3)
    assert script.keys_used() == [0, 1, 1, 1, 1, 1]
    assert r.metrics()["search/quota_exhausted_keys"] == 1.0
    warning = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any("key#0[sha256:" in w and "quota" in w for w in warning)


async def test_all_keys_retired_raises(make):
    r = make(Script(reply({"Code": 30002})))
    with pytest.raises(SearchError, match="retired"):
        await r.search(["q"], topk=3)
    assert r.metrics()["search/error_rate"] == 1.0


async def test_all_keys_rate_limited_beyond_bound_raises(make):
    script = Script(reply({}, status=429, headers={"Retry-After": "600"}))
    r = make(script, max_key_wait_s=1.0)
    with pytest.raises(SearchError, match="rate-limited"):
        await r.search(["q"], topk=3)
    assert script.keys_used() == [0, 1]


# ---- transient failures ---------------------------------------------------------------------


async def test_timeout_is_retried_then_succeeds(make):
    def slow(_request: Request) -> Response:
        time.sleep(0.6)
        return ok(item())

    script = Script(slow, ok(item()))
    r = make(script, timeout_s=0.2)
    [docs] = await r.search(["q"], topk=3)
    assert docs and len(script.auth) == 2
    assert r.metrics()["search/timeout_rate"] == 1.0


async def test_5xx_retried_with_exponential_backoff(make):
    script = Script(reply({}, status=503), reply({}, status=502), ok(item()))
    r = make(script, backoff_s=0.05)
    start = time.perf_counter()
    [docs] = await r.search(["q"], topk=3)
    assert docs and len(script.auth) == 3
    assert time.perf_counter() - start >= 0.05 + 0.10


async def test_5xx_gives_up_after_max_retries(make):
    script = Script(reply({}, status=500))
    r = make(script, max_retries=2)
    with pytest.raises(SearchError, match="after 3 attempts: HTTP 500"):
        await r.search(["q"], topk=3)
    assert len(script.auth) == 3


async def test_malformed_json_raises_without_retry(make):
    script = Script(Response("{not json", status=200, content_type="application/json"))
    r = make(script)
    with pytest.raises(SearchError, match="malformed JSON"):
        await r.search(["q"], topk=3)
    assert len(script.auth) == 1


async def test_unknown_api_code_raises(make):
    r = make(Script(reply({"Code": 10003, "Message": "invalid query"})))
    with pytest.raises(SearchError, match="Code 10003: invalid query"):
        await r.search(["q"], topk=3)


# ---- credentials ----------------------------------------------------------------------------


@pytest.fixture
def no_keys(monkeypatch, tmp_path):
    """No Zhihu variable in the environment and a working directory without a .env."""
    for name in KEY_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_missing_env_is_a_clear_error(no_keys, monkeypatch):
    msg = r"none of ZHIHU_SEARCH_KEYS, ZHIHU_SEARCH_KEY, ZHIHU_ACCESS_SECRET.*\.env.*export"
    with pytest.raises(MissingCredentialsError, match=msg):
        ZhihuRetriever(ZhihuConfig())
    problems = ZhihuRetriever.check_credentials(ZhihuConfig())
    assert len(problems) == 1 and "ZHIHU_ACCESS_SECRET" in problems[0]
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", " , \n")
    with pytest.raises(MissingCredentialsError):
        ZhihuRetriever(ZhihuConfig())


@pytest.mark.parametrize("name", KEY_ENV_VARS)
def test_each_lab_variable_is_a_fallback(no_keys, monkeypatch, name):
    monkeypatch.setenv(name, "zk-one,zk-two")
    assert find_keys("ZHIHU_SEARCH_KEYS", ".env") == (["zk-one", "zk-two"], name)
    assert ZhihuRetriever.check_credentials(ZhihuConfig()) == []


def test_fallback_order_is_the_labs(no_keys, monkeypatch):
    monkeypatch.setenv("ZHIHU_ACCESS_SECRET", "zk-third")
    monkeypatch.setenv("ZHIHU_SEARCH_KEY", "zk-second")
    assert find_keys("ZHIHU_SEARCH_KEYS", None) == (["zk-second"], "ZHIHU_SEARCH_KEY")
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", "zk-first")
    assert find_keys("ZHIHU_SEARCH_KEYS", None) == (["zk-first"], "ZHIHU_SEARCH_KEYS")
    monkeypatch.setenv("MY_KEYS", "zk-mine")  # a configured keys_env comes before all of them
    assert find_keys("MY_KEYS", None) == (["zk-mine"], "MY_KEYS")


def test_dotenv_file_fills_unset_variables_only(no_keys, monkeypatch):
    (no_keys / ".env").write_text(
        "# Zhihu keys\n"
        "export ZHIHU_SEARCH_KEY='zk-from-file-1'\n"
        'ZHIHU_ACCESS_SECRET="zk-from-file-2"  \n'
        "OTHER=1 # comment\n"
        "not a line\n"
    )
    assert read_dotenv(".env") == {"ZHIHU_SEARCH_KEY": "zk-from-file-1",
                                   "ZHIHU_ACCESS_SECRET": "zk-from-file-2", "OTHER": "1"}
    assert find_keys("ZHIHU_SEARCH_KEYS", ".env") == (["zk-from-file-1"],
                                                      "ZHIHU_SEARCH_KEY in .env")
    retriever = ZhihuRetriever(ZhihuConfig())
    assert len(retriever._pool) == 1 and "ZHIHU_SEARCH_KEY" not in __import__("os").environ
    monkeypatch.setenv("ZHIHU_SEARCH_KEY", "zk-from-env")  # the environment wins, as in dotenv
    assert find_keys("ZHIHU_SEARCH_KEYS", ".env")[0] == ["zk-from-env"]
    assert find_keys("ZHIHU_SEARCH_KEYS", None) == (["zk-from-env"], "ZHIHU_SEARCH_KEY")
    assert ZhihuRetriever.check_credentials(ZhihuConfig(env_file=None)) == []


def test_keys_from_dotenv_never_reach_logs_or_reprs(no_keys, caplog):
    (no_keys / ".env").write_text("ZHIHU_SEARCH_KEYS=zk-SECRET-dotenv-91c2,zk-SECRET-dotenv-07ab\n")
    caplog.set_level(logging.DEBUG)
    retriever = ZhihuRetriever(ZhihuConfig())
    blob = "\n".join([repr(retriever), repr(retriever._pool), caplog.text,
                      json.dumps(retriever.metrics())])
    assert "keys=2 from $ZHIHU_SEARCH_KEYS in .env" in blob and "SECRET" not in blob


def test_keys_from_env_comma_or_newline(monkeypatch):
    assert parse_keys(" a, b\n\nc ,a,\n") == ["a", "b", "c"]
    monkeypatch.setenv("MY_KEYS", "k1\nk2,k3")
    cfg = ZhihuConfig(keys_env="MY_KEYS")
    assert ZhihuRetriever.check_credentials(cfg) == []
    assert "keys=3 from $MY_KEYS" in repr(ZhihuRetriever(cfg))


# ---- concurrency ----------------------------------------------------------------------------


def test_one_concurrency_setting():
    assert "max_concurrency" not in ZhihuConfig.__dataclass_fields__  # rollout.search_concurrency


async def test_queries_run_concurrently_within_the_bound(make):
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def tracked(request: Request) -> Response:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.15)
        with lock:
            state["now"] -= 1
        return ok(item(title=request.args["Query"]))

    r = make(Script(tracked), max_concurrency=2)
    queries = [f"q{i}" for i in range(6)]
    results = await r.search(queries, topk=3)
    assert [docs[0].title for docs in results] == queries
    assert state["max"] == 2


# ---- secrets --------------------------------------------------------------------------------


async def test_keys_never_leak(make, caplog, capsys):
    leaky = reply({"Code": 10001, "Message": f"bad token {KEYS[0]} / {KEYS[1]}"}, status=401)
    scenarios = [
        (Script(reply({}, status=429), ok(item())), {}),
        (Script(reply({"Code": 30002})), {}),
        (Script(reply({}, status=503)), {"max_retries": 1}),
        (Script(lambda _: (time.sleep(0.5), ok(item()))[1]), {"timeout_s": 0.1, "max_retries": 0}),
        (Script(Response("<html>", status=200)), {}),
        (Script(reply({"Code": 10001, "Message": f"token {KEYS[1]} invalid"})), {}),
        (Script(leaky), {}),
    ]
    texts: list[str] = []
    caplog.set_level(logging.DEBUG)
    for script, cfg in scenarios:
        r = make(script, **cfg)
        try:
            await r.search(["q"], topk=3)
        except Exception as err:  # noqa: BLE001 - every error's text is checked below
            texts += [str(err), repr(err), "".join(traceback.format_exception(err))]
        texts += [repr(r), repr(r._pool), json.dumps(r.metrics())]
        assert script.auth, "every scenario must reach its own handler"
    out = capsys.readouterr()
    texts += [caplog.text, out.out, out.err]
    blob = "\n".join(texts)
    assert "key#0[sha256:" in blob  # the fingerprint is what gets logged
    for key in KEYS:
        assert key not in blob
        assert key[-12:] not in blob
