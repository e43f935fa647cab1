"""The supervised warm start: oracle rendering, the cache key, SFT on a tiny model, config."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.base import EngineCapabilities
from searchr1.config import register_configs
from searchr1.data.types import Dataset, QAExample
from searchr1.data.world import WorldConfig, generate_world
from searchr1.engines.local.training.client import create_lora_training_client
from searchr1.protocols.base import ActionKind, Observation
from searchr1.protocols.tags import TagsProtocol
from searchr1.protocols.tool_call import ToolCallProtocol
from searchr1.retrievers.bm25 import BM25Retriever
from searchr1.rollout.config import RolloutConfig
from searchr1.warmstart import cache
from searchr1.warmstart.apply import apply_warm_start
from searchr1.warmstart.config import MixConfig
from searchr1.warmstart.oracle import OracleError, OracleRenderer
from searchr1.warmstart.phrasing import query_variants, question_form
from searchr1.warmstart.sft import heldout_nll, run_sft, sft_datum
from tests.conftest import tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
LIMITS = dict(max_searches=3, max_turns=4, max_turn_tokens=400, max_observation_tokens=600,
              max_trajectory_tokens=4000)  # char-level tokens: long


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture(scope="module")
def world():
    return generate_world(WorldConfig())


@pytest.fixture(scope="module")
def retriever(world):
    return BM25Retriever(world.corpus)


@pytest.fixture(scope="module", params=["tags", "tool_call"])
def protocol(request):
    tok = tiny_tokenizer()
    return TagsProtocol(tok) if request.param == "tags" else ToolCallProtocol(tok)


def _render(protocol, retriever, world, examples, count, mix=None, **limits):
    renderer = OracleRenderer(protocol, retriever, 3, RolloutConfig(**{**LIMITS, **limits}),
                              world.corpus, mix or MixConfig())
    return asyncio.run(renderer.render_many(examples, count, seed=0)), renderer


# ---- oracle rendering ----------------------------------------------------------------------

def test_oracle_tokens_masks_and_observations_match_a_rollout(protocol, retriever, world):
    trajs, _ = _render(protocol, retriever, world, world.train[:40], 40)
    assert len(trajs) >= 35
    for traj in trajs:
        prompt = protocol.initial_prompt(traj.example.question)
        assert traj.tokens_T[: len(prompt)] == prompt and set(traj.mask_T[: len(prompt)]) == {0}
        pos = len(prompt)
        for turn in traj.turns:
            n, m = len(turn.sampled_tokens), turn.observation_len
            assert traj.tokens_T[pos: pos + n] == turn.sampled_tokens
            assert traj.mask_T[pos: pos + n] == [1] * n
            if turn.action.kind is ActionKind.SEARCH:  # what the retriever returns, rendered
                docs = asyncio.run(retriever.search([turn.action.query], 3))[0]
                expected, _ = protocol.observation_tokens(
                    turn.sampled_tokens, Observation(documents=tuple(docs)), 600)
                assert traj.tokens_T[pos + n: pos + n + m] == expected
                assert traj.mask_T[pos + n: pos + n + m] == [0] * m
            pos += n + m
        assert pos == len(traj.tokens_T) == len(traj.mask_T)


def test_every_oracle_turn_parses_to_its_action_and_the_answer_is_gold(protocol, retriever,
                                                                       world):
    trajs, _ = _render(protocol, retriever, world, world.train[:40], 40)
    tok = protocol.tokenizer
    for traj in trajs:
        texts = [tok.decode(t.sampled_tokens) for t in traj.turns]
        actions = [protocol.parse_action(text) for text in texts]
        assert [a.kind for a in actions[:-1]] == [ActionKind.SEARCH] * (len(actions) - 1)
        assert actions[-1].kind is ActionKind.ANSWER
        assert protocol.final_answer(texts) == traj.example.golden_answers[0]
        assert protocol.is_valid_format(texts, [t.observation_text for t in traj.turns])
        shown = {d.id for t in traj.turns for d in t.documents}
        assert set(traj.example.supporting_ids) <= shown  # every hop's passage was retrieved


def test_fail_first_searches_the_question_then_reformulates(retriever, world):
    protocol = TagsProtocol(tiny_tokenizer())
    examples = [ex for ex in world.train if ex.meta.get("needs_reformulation")][:30]
    mix = MixConfig(fail_first=1.0)
    trajs, renderer = _render(protocol, retriever, world, examples, 30, mix=mix)
    assert renderer.stats.failed_searches > 0
    missed = [t for t in trajs if len(t.turns) - 1 > len(t.example.oracle_queries)]
    assert len(missed) >= len(trajs) // 4  # 3-hop ones have no spare search in a budget of 3
    for t in missed:  # the question verbatim, a miss, then the next search finds the passage
        i = next(i for i, turn in enumerate(t.turns) if turn.action.query ==
                 t.example.question.strip())
        needed = {d.id for d in t.turns[i + 1].documents} & set(t.example.supporting_ids)
        assert needed and "<think>" in t.turns[i + 1].text
    never, _ = _render(protocol, retriever, world, examples, 30, mix=MixConfig(fail_first=0))
    assert not any(turn.action.query == t.example.question.strip() for t in never
                   for turn in t.turns)


def test_phrasing_shares_and_variants(retriever, world):
    protocol = TagsProtocol(tiny_tokenizer())
    only_relation = MixConfig(name_only=0, relation=1, question=0, fail_first=0)
    trajs, _ = _render(protocol, retriever, world, world.train[:30], 30, mix=only_relation)
    for t in trajs:
        queries = [turn.action.query for turn in t.turns[:-1]]
        assert queries[: len(t.example.oracle_queries)] == list(t.example.oracle_queries)[
            : len(queries)] or len(queries) > len(t.example.oracle_queries)
    _, renderer = _render(protocol, retriever, world, world.train[:60], 60)
    assert {"name_only", "relation", "question"} <= set(renderer.stats.phrasings)
    assert query_variants("when was Ada Vell born", "Ada Vell") == {
        "name_only": "Ada Vell", "relation": "when was Ada Vell born",
        "question": "When was Ada Vell born?"}
    assert question_form("Vell Works headquarters", "Vell Works") == \
        "What is the headquarters of Vell Works?"
    assert query_variants("the violinist born in Tormi", "Ada Vell") == {
        "relation": "the violinist born in Tormi"}


def test_search_budget_skips_questions_that_need_more_searches(retriever, world):
    protocol = TagsProtocol(tiny_tokenizer())
    trajs, renderer = _render(protocol, retriever, world, world.train[:40], 40, max_searches=1)
    assert trajs and renderer.stats.skipped_budget > 0
    assert all(sum(t.action.kind is ActionKind.SEARCH for t in tr.turns) == 1 for tr in trajs)


def test_data_without_oracle_queries_names_the_option(retriever, world):
    protocol = TagsProtocol(tiny_tokenizer())
    nq = [QAExample("q1", "who wrote hamlet?", ("Shakespeare",), "nq")]
    with pytest.raises(OracleError, match="warmstart=none"):
        _render(protocol, retriever, world, nq, 1)


# ---- cache key -----------------------------------------------------------------------------

@pytest.mark.parametrize("override", [
    "model.lora_rank=16", "model.name=other", "data.seed=1", "data.alias_prob=0.5",
    "protocol=tool_call", "retriever.topk=2", "warmstart.steps=7", "warmstart.batch_size=3",
    "warmstart.learning_rate=0.1", "warmstart.mix.fail_first=0.5", "warmstart.seed=3", "seed=5",
    "rollout.max_searches=3",
])
def test_cache_key_changes_with_every_input(override):
    base = cache.fingerprint(cache.full_inputs(_compose(["warmstart=oracle_sft"])))
    changed = cache.fingerprint(cache.full_inputs(_compose(["warmstart=oracle_sft", override])))
    assert base != changed


def test_cache_key_changes_with_the_world_generator_version(monkeypatch):
    cfg = _compose(["warmstart=oracle_sft"])
    before = cache.fingerprint(cache.full_inputs(cfg))
    monkeypatch.setattr(cache, "WORLD_GENERATOR_VERSION", 999)
    assert cache.fingerprint(cache.full_inputs(cfg)) != before
    assert cache.fingerprint(cache.full_inputs(cfg)) == cache.fingerprint(cache.full_inputs(cfg))


# ---- config --------------------------------------------------------------------------------

def test_default_config_composes_with_the_warm_start_and_mode_sft():
    default = _compose([])
    assert default.warmstart.name == "embedded"
    # the packaged adapter matches the default config (else the default run would refuse it)
    from searchr1.warmstart.apply import asset_dir

    cache.check_asset(asset_dir(default), default)
    cache.check_rank(asset_dir(default), default.model.lora_rank, default.model.lora_alpha)
    cfg = _compose(["warmstart=oracle_sft", "mode=sft"])
    assert (cfg.warmstart.name, cfg.mode.value) == ("oracle_sft", "sft")
    assert cfg.warmstart.init_from is None and 0 <= cfg.warmstart.mix.fail_first <= 1
    cfg = _compose(["warmstart=embedded", "warmstart.init_from=/x"])
    assert cfg.warmstart.init_from == "/x"
    with pytest.raises(Exception, match="stepz"):
        _compose(["warmstart=oracle_sft", "warmstart.stepz=3"])


# ---- SFT on a tiny model -------------------------------------------------------------------

def _tiny_client(tmp_path, tok, rank=4, alpha=8):
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, pad_token_id=0, eos_token_id=1,
                      initializer_range=0.3)  # logits wide enough for LoRA to move the CE
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = LlamaForCausalLM(cfg)
    return create_lora_training_client(base, tok, rank=rank, alpha=alpha, seed=0,
                                       checkpoint_dir=tmp_path)


SFT_LIMITS = {**LIMITS, "max_searches": 1, "max_observation_tokens": 200}  # short sequences


def _sft_cfg(tmp_path, *extra):
    return _compose(["warmstart=oracle_sft", "model.lora_rank=4", "model.lora_alpha=8",
                     f"engine.cache_dir={tmp_path / 'cache'}", "warmstart.steps=8",
                     "warmstart.batch_size=2", "warmstart.learning_rate=0.05",
                     "warmstart.heldout_questions=2",
                     *[f"rollout.{k}={v}" for k, v in SFT_LIMITS.items()], *extra])


def _one_hop(world) -> Dataset:
    """The world's 1-hop questions only: the shortest trajectories (CPU test time)."""
    def pick(split):
        return [e for e in split if e.data_source == "world_1hop"]
    return Dataset(pick(world.train), pick(world.dev), [], world.corpus)


def test_sft_datum_carries_loss_only_on_sampled_tokens(retriever, world):
    protocol = TagsProtocol(tiny_tokenizer())
    traj = _render(protocol, retriever, world, world.train[:1], 1)[0][0]
    datum = sft_datum(traj, 10_000)
    weights = datum.loss_fn_inputs["weights"].to_numpy()
    targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
    assert weights.tolist() == traj.mask_T[1:]
    assert np.all(targets[weights == 0] == -100)
    assert targets[weights == 1].tolist() == [t for t, m in zip(traj.tokens_T[1:],
                                                                 traj.mask_T[1:]) if m]


def test_tiny_warm_start_lowers_heldout_cross_entropy_and_is_cached(tmp_path, retriever, world):
    tok = tiny_tokenizer()
    protocol = TagsProtocol(tok)
    cfg, data = _sft_cfg(tmp_path), _one_hop(world)
    rollout = SimpleNamespace(protocol=protocol, retriever=retriever, topk=3,
                              cfg=RolloutConfig(**SFT_LIMITS))
    heldout, _ = _render(protocol, retriever, world, data.dev[2:6], 4, **SFT_LIMITS)
    logged: list[tuple[dict, int]] = []
    tracker = SimpleNamespace(log=lambda m, s: logged.append((m, s)))
    client = _tiny_client(tmp_path / "a", tok)
    before = heldout_nll(client, heldout, 10_000)
    metrics = asyncio.run(apply_warm_start(cfg, client, data, rollout, tracker, tmp_path))
    after = heldout_nll(client, heldout, 10_000)
    assert after < 0.8 * before, (before, after)
    assert metrics["warmstart/cached"] == 0.0 and [s for _, s in logged] == list(range(1, 9))
    assert metrics["warmstart/heldout_nll_after"] < metrics["warmstart/heldout_nll_before"]
    entry = cache.cache_root(cfg) / cache.fingerprint(cache.full_inputs(cfg))
    assert cache.read_record(entry)["full"] == entry.name
    # a second fresh client gets the cached adapters: same weights, no training
    again = _tiny_client(tmp_path / "b", tok)
    logged.clear()
    metrics = asyncio.run(apply_warm_start(cfg, again, data, rollout, tracker, tmp_path))
    assert metrics["warmstart/cached"] == 1.0 and not logged
    assert heldout_nll(again, heldout, 10_000) == pytest.approx(after, rel=1e-6)


def test_run_sft_rejects_an_empty_pool(tmp_path):
    with pytest.raises(ValueError, match="no oracle trajectories"):
        run_sft(None, [], steps=1, batch_size=1, learning_rate=0.1, seed=0, adam={},
                max_tokens=10)


# ---- saved adapters: rank check and the embedded asset -------------------------------------

def _lora_b(client) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in client.model.state_dict().items() if "lora_B" in k}


def _saved_adapter(tmp_path, cfg, tok) -> tuple[Path, dict[str, torch.Tensor]]:
    """A compact asset of a client with random (nonzero) lora_B, and those weights."""
    client = _tiny_client(tmp_path / "src", tok)
    with torch.no_grad():
        for name, p in client.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    saved = Path(client.save_weights_for_sampler("x").result().path)
    asset = cache.write_compact(saved, tmp_path / "asset", cache.fingerprint_record(cfg))
    return asset, _lora_b(client)


def test_compact_adapter_is_bf16_and_rank_mismatch_is_refused(tmp_path):
    from safetensors.torch import load_file

    tok = tiny_tokenizer()
    cfg = _sft_cfg(tmp_path)
    asset, _ = _saved_adapter(tmp_path, cfg, tok)
    weights = load_file(str(asset / cache.ADAPTER_WEIGHTS))
    assert weights and all(v.dtype == torch.bfloat16 for v in weights.values())
    assert json.loads((asset / cache.FINGERPRINT_FILE).read_text())["compat"] == \
        cache.fingerprint(cache.compat_inputs(cfg))
    with pytest.raises(ValueError, match="model.lora_rank=4"):
        cache.check_rank(asset, 8, 16)


def test_embedded_asset_loads_for_another_world_and_refuses_another_protocol(
        tmp_path, monkeypatch, retriever, world):
    tok = tiny_tokenizer()
    cfg = _sft_cfg(tmp_path, "warmstart=embedded", "warmstart.asset=asset")
    asset, source = _saved_adapter(tmp_path, cfg, tok)
    monkeypatch.setattr(cache, "ASSETS", asset.parent)
    client = _tiny_client(tmp_path / "dst", tok)
    assert all(float(v.abs().max()) == 0.0 for v in _lora_b(client).values())
    asyncio.run(apply_warm_start(cfg, client, world, None, None, tmp_path))
    loaded = _lora_b(client)
    assert loaded.keys() == source.keys()
    for key, value in source.items():  # the asset's bf16 values, now in the fp32 model
        assert torch.equal(loaded[key], value.to(torch.bfloat16).to(loaded[key].dtype))
    missing = _sft_cfg(tmp_path, f"warmstart.init_from={tmp_path / 'nowhere'}")
    with pytest.raises(FileNotFoundError, match="init_from"):
        asyncio.run(apply_warm_start(missing, client, world, None, None, tmp_path))
    # the adapter's behaviour does not depend on which world or retriever a run trains with
    world2 = _sft_cfg(tmp_path, "warmstart=embedded", "warmstart.asset=asset", "data.seed=1",
                      "retriever.topk=2")
    asyncio.run(apply_warm_start(world2, _tiny_client(tmp_path / "w", tok), world, None, None,
                                 tmp_path))
    other = _sft_cfg(tmp_path, "warmstart=embedded", "warmstart.asset=asset", "protocol=tool_call")
    with pytest.raises(ValueError, match="another model or protocol.*'tags', this run 'tool_call'"):
        asyncio.run(apply_warm_start(other, _tiny_client(tmp_path / "o", tok), world, None,
                                     None, tmp_path))


# ---- the packaged warm start at start-up ---------------------------------------------------

@pytest.mark.parametrize("overrides", [
    ["retriever=zhihu", "reward=em_format"],  # the headline command
    ["experiment=smoke", "retriever.cache=disk"],
    ["data=lab_jsonl", "data.train_path=t.jsonl", "data.dev_path=d.jsonl", "retriever.corpus_path=c.jsonl"],
    ["retriever.topk=5", "retriever.max_concurrency=2", "data.seed=3"],
])
def test_packaged_warm_start_fits_any_retriever_cache_or_data(overrides):
    cfg = _compose(overrides)
    assert cfg.warmstart.name == "embedded"
    assert cache.startup_problems(cfg) == []


@pytest.mark.parametrize("override, named", [
    ("protocol=tool_call", "protocol: adapter 'tags', this run 'tool_call'"),
    ("model.lora_rank=4", "model.lora_rank: adapter 8, this run 4"),
    ("protocol.cut=official", "protocol.cut: adapter 'first_stop', this run 'official'"),
])
def test_packaged_warm_start_names_what_does_not_fit_and_both_ways_out(override, named):
    (problem,) = cache.startup_problems(_compose([override]))
    assert named in problem and "warmstart=none" in problem and "mode=sft" in problem
    # a resume, an eval or another warm start is not checked against the packaged adapter
    for extra in (["mode=eval"], ["warmstart=none"], ["warmstart.init_from=/x"]):
        assert cache.startup_problems(_compose([override, *extra])) == []


def test_protocol_texts_are_part_of_the_compat_fingerprint(monkeypatch):
    from searchr1.protocols import tags

    before = cache.fingerprint(cache.compat_inputs(_compose([])))
    monkeypatch.setattr(tags, "PROMPT_TEMPLATE", tags.PROMPT_TEMPLATE.replace("Answer", "Reply"))
    assert cache.fingerprint(cache.compat_inputs(_compose([]))) != before
    assert cache.startup_problems(_compose([])) != []


def test_main_refuses_an_unfitting_warm_start_before_loading_a_model(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "searchr1.main", "protocol=tool_call", f"hydra.run.dir={run_dir}",
         "model.hf_id=/nonexistent/model"],  # loading a model would fail differently
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "warmstart=none" in proc.stderr and "'tool_call'" in proc.stderr


def test_mode_sft_end_to_end_exports_the_adapter(tmp_path, tiny_model_dir):
    args = ["mode=sft", "warmstart=oracle_sft", f"model.hf_id={tiny_model_dir}",
            "model.gguf_file=null", "model.lora_rank=4", "model.lora_alpha=8",
            "engine.device=cpu", f"engine.cache_dir={tmp_path / 'cache'}", "warmstart.steps=2",
            "warmstart.batch_size=2", "warmstart.heldout_questions=2",
            "data.train_questions=40", "data.dev_questions=8", "data.test_questions=8",
            "rollout.max_trajectory_tokens=1500", "rollout.max_turn_tokens=300",
            "rollout.max_observation_tokens=200", "rollout.max_searches=1",
            "rollout.max_turns=2"]
    cmd = [sys.executable, "-m", "searchr1.main", f"hydra.run.dir={tmp_path}", *args]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    adapter = tmp_path / "warmstart_adapter"
    assert str(adapter) in out.stdout
    assert (adapter / cache.ADAPTER_WEIGHTS).exists()
    assert (adapter / cache.FINGERPRINT_FILE).exists()
    assert "mode=sft" in (adapter / "COMMAND").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["warmstart/trajectories"] == 4 and summary["warmstart/adapter_bytes"] > 0


def test_full_tuning_refuses_a_lora_warm_start_at_start_up():
    (problem,) = cache.startup_problems(_compose(["model.tuning=full"]))  # warmstart=embedded
    assert "model.tuning=full" in problem and "warmstart=none" in problem
    assert cache.startup_problems(_compose(["model.tuning=full", "warmstart=none"])) == []
    assert cache.startup_problems(_compose(["model.tuning=full", "warmstart=none",
                                            "warmstart.init_from=trio://run/state"])) == []


class _Freezable:
    capabilities = EngineCapabilities(in_process=True, freeze_reference=True)

    def __init__(self):
        self.calls = 0

    def freeze_reference(self):
        self.calls += 1


@pytest.mark.parametrize("overrides, frozen", [
    (["loss.kl.coef=0.001"], True),  # the embedded warm start, with KL: the reference follows it
    (["loss.kl.coef=0"], False),  # no KL term: no reference to fix
    (["loss.kl.coef=0.001", "warmstart=none"], False),  # adapters off already is the start
    (["loss.kl.coef=0.001", "warmstart=none", "warmstart.init_from=/a"], True),
])
def test_fix_reference_freezes_exactly_when_a_warm_start_moved_the_policy(overrides, frozen):
    from searchr1.warmstart.apply import fix_reference

    client = _Freezable()
    assert fix_reference(_compose(overrides), client) is frozen
    assert client.calls == int(frozen)
    remote = SimpleNamespace(capabilities=EngineCapabilities())  # engine=trio: a warning only
    assert fix_reference(_compose(overrides), remote) is False
