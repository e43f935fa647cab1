"""engine=trio against pytrio 0.2.9's real clients, with only the network replaced.

``tests/helpers/trio_fake.py`` answers pytrio at ``httpx.AsyncHTTPTransport.handle_async_request``;
everything above it is pytrio's own code: ``ServiceClient`` login and session, run creation,
``plan_training_batch`` (validation, chunking, global totals), the payload builders, the
MessagePack event codec, the training coordinator, the sampling coordinator. Assertions are
made on what arrives at that boundary, decoded.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest
import pytrio
from omegaconf import OmegaConf
from pytrio.client.training_batch import plan_training_batch
from pytrio.config.config import auth_state, configuration
from pytrio.model.limits import TrainingLimits
from transformers import AutoTokenizer

from searchr1.loop.checkpoint import resolve_resume
from searchr1.config import Config
from searchr1.data.types import Dataset, QAExample
from searchr1.build import build_step_runner
from searchr1.engines import ENGINES
from searchr1.engines.base import LoopLimits
from searchr1.engines.local.model import ModelConfig
from searchr1.engines.trio import TrioEngineConfig, TrioEngineError, TrioService, check_credentials
from searchr1.losses.config import LossConfig
from searchr1.startup.errors import StartupError
from searchr1.protocols.tool_call import ToolCallProtocol
from searchr1.rewards import RewardConfig, build_reward
from searchr1.batch.shifted import IGNORE
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.types import Trajectory
from searchr1.advantages.config import AdvantageConfig
from searchr1.rollout.config import RolloutConfig
from searchr1.loop.config import TrainerConfig
from searchr1.batch.step_batch import build_step_batch
from searchr1.loop.update import UpdateSettings, collect_minibatch, plan_update, submit_minibatch
from searchr1.loop.trainer import Trainer
from tests.helpers.rollout_fakes import SlowRetriever
from tests.helpers.step_batches import reference_datum
from tests.protocols.test_tool_call import FIXTURES, make_tokenizer
from tests.helpers.trio_fake import CONTROL, FakeTrio

CONF = Path(__file__).resolve().parents[2] / "conf"
LAB_LIMITS = TrainingLimits(max_batch_size=32, max_tokens_per_request=64_000, max_seq_len=8192)
BASE_MODEL = "Qwen/Qwen3.5-4B"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A small BPE tokenizer with Qwen3.5's real chat template, saved where pytrio can load it."""
    out = tmp_path_factory.mktemp("qwen35-tok")
    make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text()).save_pretrained(out)
    return out


@pytest.fixture()
def logged_in(monkeypatch):
    """pytrio's in-process credential, as `trio login` or PYTRIO_API_KEY would leave it."""
    monkeypatch.setattr(auth_state, "api_key", "sk-test")
    monkeypatch.setattr(auth_state, "config_error", None)


@pytest.fixture()
def fake(monkeypatch, tok_dir):
    server_tok = AutoTokenizer.from_pretrained(tok_dir)  # own instance: runs in pytrio's thread
    f = FakeTrio(str(tok_dir), decode=lambda t: server_tok.decode(t, skip_special_tokens=False))
    f.tokenizer = server_tok
    yield f.install(monkeypatch)
    assert not f.unexpected, f.unexpected


def engine_cfg(**kw) -> TrioEngineConfig:
    kw = {"base_url": CONTROL, "telemetry": False, "control_retry_timeout_seconds": 0.0,
          "training_retry_timeout_seconds": 0.0, "sampling_retry_timeout_seconds": 0.0, **kw}
    return TrioEngineConfig(**kw)


def model_cfg(hf_id: str = BASE_MODEL, **kw) -> ModelConfig:
    return ModelConfig(name="qwen3_5_4b", hf_id=hf_id, gguf_file=None, lora_rank=32, **kw)


@pytest.fixture()
def service(fake, logged_in, tmp_path):
    svc = TrioService(engine_cfg(), model_cfg(), tmp_path)
    yield svc
    svc.close()


# ------------------------------------------------------------------------ credentials


@pytest.fixture()
def home(monkeypatch, tmp_path):
    """An empty HOME and no PYTRIO_* variables."""
    for var in ("PYTRIO_API_KEY", "PYTRIO_ENV", "PYTRIO_BASE_URL", "PYTRIO_LOG_LEVEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_no_login_gives_one_message_naming_the_fixes(home):
    (msg,) = check_credentials(TrioEngineConfig())
    assert "trio login" in msg and "PYTRIO_API_KEY" in msg and "default PyTRIO profile" in msg


def test_api_key_env_var_is_enough(home, monkeypatch):
    monkeypatch.setenv("PYTRIO_API_KEY", "sk-env")
    assert check_credentials(TrioEngineConfig()) == []


def test_saved_login_of_the_default_profile(home):
    (home / ".pytrio").mkdir()
    (home / ".pytrio" / "config.toml").write_text('api_key = "sk-saved"\n')
    assert check_credentials(TrioEngineConfig()) == []


def test_active_named_profile_is_the_one_checked(home):
    root = home / ".pytrio"
    (root / "envs" / "lab").mkdir(parents=True)
    (root / "env.toml").write_text('active_env = "lab"\n')
    (root / "config.toml").write_text('api_key = "sk-default-is-not-active"\n')
    (root / "envs" / "lab" / "config.toml").write_text('base_url = "https://lab.example"\n')
    (msg,) = check_credentials(TrioEngineConfig())
    assert "profile 'lab'" in msg
    (root / "envs" / "lab" / "config.toml").write_text('api_key = "sk-lab"\n')
    assert check_credentials(TrioEngineConfig()) == []


def test_pytrio_env_naming_a_missing_profile(home, monkeypatch):
    monkeypatch.setenv("PYTRIO_ENV", "nope")
    monkeypatch.setenv("PYTRIO_API_KEY", "sk-env")  # pytrio still refuses: the profile is missing
    (msg,) = check_credentials(TrioEngineConfig())
    assert "PYTRIO_ENV=nope" in msg and "trio env use nope" in msg


def test_unreadable_config_file(home):
    (home / ".pytrio").mkdir()
    (home / ".pytrio" / "config.toml").write_text("api_key = [unclosed\n")
    (msg,) = check_credentials(TrioEngineConfig())
    assert "config.toml" in msg and "trio login" in msg


def test_preflight_reports_the_missing_login(home):
    from hydra import compose, initialize_config_dir

    from searchr1.config import register_configs
    from searchr1.startup.preflight import problems
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["engine=trio"])
    assert cfg.engine.name == "trio" and cfg.engine.base_url is None
    assert any("trio login" in p for p in problems(cfg))


# ------------------------------------------------------------------------- connecting


def test_missing_login_fails_at_construction_with_one_message(fake, monkeypatch, tmp_path):
    monkeypatch.setattr(auth_state, "api_key", "")
    with pytest.raises(TrioEngineError) as err:
        TrioService(engine_cfg(), model_cfg(), tmp_path)
    assert isinstance(err.value, StartupError)  # a clean exit with the message
    assert str(err.value) == ("engine=trio: no PyTRIO API key: run `trio login` (it saves the "
                              "key under ~/.pytrio) or set PYTRIO_API_KEY")
    assert fake.requests == []  # refused before any request


def test_rejected_key(fake, logged_in, tmp_path):
    fake.reject_key = True
    with pytest.raises(TrioEngineError, match=r"PyTRIO at http://trio.test rejected the API key "
                                              r"\(invalid API key\); run `trio login`"):
        TrioService(engine_cfg(), model_cfg(), tmp_path)


def test_unreachable_service(fake, logged_in, tmp_path):
    fake.unreachable = True
    with pytest.raises(TrioEngineError, match=r"cannot reach PyTRIO at http://trio.test.*base_url"):
        TrioService(engine_cfg(), model_cfg(), tmp_path)


def test_settings_apply_to_the_service_only(fake, logged_in, tmp_path):
    before = configuration.model_dump()
    svc = TrioService(engine_cfg(request_timeout_seconds=7, sampling_timeout_seconds=99),
                      model_cfg(), tmp_path)
    try:
        runtime = svc.client._runtime.configuration  # pytrio's per-client copy
        assert (runtime.base_url, runtime.request_timeout_seconds) == (CONTROL, 7)
        assert runtime.sampling_timeout_seconds == 99
        assert configuration.model_dump() == before  # the process-wide settings are untouched
    finally:
        svc.close()
    assert ("POST", "trio.test/api/openapi/v1/service-sessions/ss_1/close") in fake.requests


def test_embedded_model_is_refused_before_connecting(fake, logged_in, tmp_path):
    with pytest.raises(TrioEngineError, match="model=qwen3_5_4b"):
        TrioService(engine_cfg(), ModelConfig(), tmp_path)  # the embedded default
    assert fake.requests == []


def test_registry_builds_the_service(fake, logged_in, tmp_path):
    svc = ENGINES.get("trio")(engine_cfg(), model_cfg(), tmp_path, LoopLimits())
    assert isinstance(svc, TrioService) and isinstance(svc.client, pytrio.ServiceClient)
    svc.close()


# ------------------------------------------------------------------- the trainer's calls


def synthetic_batch(tokenizer_vocab: int, n: int = 70, seed: int = 0):
    """``n`` trajectories (prompt, action, observation, action) of 300–9000 tokens as a step
    batch, and the arrays each of them gives built alone (``reference_datum``, the reference)."""
    rng = np.random.default_rng(seed)
    ex = QAExample(id="q", question="q?", golden_answers=("a",), data_source="nq")
    trajs, scalars, expected = [], [], []
    for i in range(n):
        total = int(rng.integers(300, 9000))
        cut = sorted(int(c) for c in rng.choice(np.arange(50, total - 10), 3, replace=False))
        tok = rng.integers(0, tokenizer_vocab, size=total).tolist()
        traj = Trajectory.start(ex, i, tok[: cut[0]])
        traj.append_sampled(tok[cut[0]: cut[1]], (-rng.random(cut[1] - cut[0])).tolist())
        traj.append_observation(tok[cut[1]: cut[2]])
        traj.append_sampled(tok[cut[2]:], (-rng.random(total - cut[2])).tolist())
        scalars.append(float(rng.normal()))
        trajs.append(traj)
        expected.append(reference_datum(traj, scalars[-1], 8192)[1])
    batch = build_step_batch(trajs, range(n), [0] * n, [np.zeros(1)] * n, n, 8192)
    batch.old_T = batch.sampler_T.copy()
    batch.advantages_T = batch.mask_T * np.repeat(scalars, batch.lengths_D)
    return batch, expected


def lab_cfg(**trainer):
    cfg = OmegaConf.structured(Config)
    cfg.loss = LossConfig(name="importance_sampling")
    cfg.trainer = TrainerConfig(learning_rate=4e-5, beta1=0.9, beta2=0.95, **trainer)
    return cfg


def test_lora_run_is_created_with_the_lab_rank(service, fake):
    client = service.create_lora_training_client(rank=32, seed=3)
    assert isinstance(client.inner, pytrio.TrainingClient)  # pytrio's own client, capabilities declared
    assert client.capabilities.pipelined and not client.capabilities.reference_logprobs
    assert fake.training_runs == [{"base_model": BASE_MODEL, "lora_rank": 32, "train_mlp": True,
                                   "train_attn": True, "train_unembed": True,
                                   "source_checkpoint_uri": "", "restore_optimizer": False,
                                   "seed": 3}]


def test_our_datums_pass_pytrio_planning(tok_dir):
    vocab = len(AutoTokenizer.from_pretrained(tok_dir))
    batch, expected = synthetic_batch(vocab)
    plan = plan_training_batch(batch.datums(), loss_fn="importance_sampling", auto_shift=False,
                               limits=LAB_LIMITS, tokenizer_vocab_size=vocab)
    assert plan.totals.total_samples == 70
    assert plan.totals.total_active_tokens == sum(int(a["mask"].sum()) for a in expected)


def test_update_sends_lab_datums_and_adam_params(service, fake):
    client = service.create_lora_training_client(rank=32, seed=0)
    batch, expected = synthetic_batch(len(fake.tokenizer))
    cfg = lab_cfg()
    settings = UpdateSettings.from_configs(cfg.loss, cfg.trainer)
    batch.plan = plan_update(batch.lengths_D, settings)
    idx = batch.plan.sent(0)
    assert sorted(idx) == list(range(batch.size))
    metrics = collect_minibatch(submit_minibatch(client, batch, 0, settings, lr=4e-5))

    chunks = fake.events_of("trainer.forward_backward")
    assert len(chunks) > 1  # the batch needs several micro-batches
    sent = [d for c in chunks for d in c["data"]]
    assert len(sent) == len(idx)
    for c in chunks:  # the lab's micro-batch limits, as pytrio's chunker applies them
        lengths = [len(d["model_input"]["chunks"][0]["tokens"]) for d in c["data"]]
        assert len(lengths) <= 32 and sum(lengths) <= 64_000 and max(lengths) <= 8192
        assert c["loss"] == {"type": "importance_sampling", "config": {}}
        assert c["auto_shift"] is False
    totals = {tuple(sorted(c["gradient_accumulation"].items())) for c in chunks}
    assert len(totals) == 1  # every micro-batch carries the logical batch's totals
    (ga,) = [dict(t) for t in totals]
    masks = [expected[i]["mask"] for i in idx]
    assert ga["total_samples"] == len(idx)
    assert ga["total_active_tokens"] == int(sum(m.sum() for m in masks))
    for i, d in zip(idx, sent):  # each datum arrives as built, in FFD order
        a = expected[i]
        assert d["model_input"]["chunks"][0]["tokens"] == a["model_input"].tolist()
        assert d["target_ids"] == a["target_tokens"].tolist()
        assert all(t == IGNORE for t, m in zip(d["target_ids"], a["mask"]) if m == 0)
        np.testing.assert_allclose(d["advantages"], a["advantages"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(d["logprobs"], a["logprobs"], rtol=1e-6, atol=1e-7)

    (opt,) = fake.events_of("trainer.optimize_step")
    assert opt["adam_params"] == {"learning_rate": 4e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                                  "weight_decay": 0.0, "grad_clip_norm": 1.0}
    (init,) = fake.events_of("trainer.init_run")
    assert init["lora_config"]["rank"] == 32 and init["load_optimizer"] is False
    assert metrics["train/lr"] == 4e-5 and metrics["train/grad_norm"] == 0.5
    q = np.concatenate([expected[i]["logprobs"][expected[i]["mask"] > 0] for i in idx])
    assert metrics["train/logprob_mismatch"] == pytest.approx(float(np.mean(q + 0.5)))
    steps = {e["metadata"]["step"] for e in fake.events if e["type"] == "trainer.forward_backward"}
    assert len(steps) == 1  # one logical step: gradient accumulation, then one optim_step


def test_lab_sampling_params_arrive(service, fake, tok_dir):
    protocol = ToolCallProtocol(AutoTokenizer.from_pretrained(tok_dir))
    rollout_cfg = RolloutConfig(group_size=8, max_trajectory_tokens=8192, max_turn_tokens=1024,
                                max_observation_tokens=1024, temperature=1.0, top_p=1.0)
    engine = RolloutEngine(protocol, SlowRetriever(delay=0.0), 3, rollout_cfg)
    prompt = protocol.initial_prompt("Who wrote Hamlet?")
    params = engine.params(SamplingSettings(temperature=1.0, top_p=1.0, seed=0),
                            8192 - len(prompt), seed=11)
    sampler = service.create_sampling_client()
    assert isinstance(sampler, pytrio.SamplingClient)
    assert service.create_sampling_client() is sampler  # one remote run for the base model
    asyncio.run(engine.sample(sampler, prompt, 8, params))

    assert fake.sampling_runs == [{"base_model": BASE_MODEL, "source_checkpoint_uri": ""}]
    (req,) = fake.samples
    assert req["sampling_params"] == {"max_tokens": 1024, "seed": 11, "temperature": 1.0,
                                      "top_k": -1, "top_p": 1.0,
                                      "stop_token_ids": list(protocol.stop)}
    assert protocol.stop == [fake.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert req["num_samples"] == 8 and req["return_token_logprobs"] is True
    assert req["prompt"]["chunks"][0]["tokens"] == list(prompt)


def test_reference_logprobs_for_kl(service, fake):
    """The base sampler's compute_logprobs_async, as train_step's KL reference uses it."""
    prompt = [5, 6, 7, 8]
    lp = asyncio.run(service.create_sampling_client().compute_logprobs_async(
        pytrio.ModelInput.from_ints(prompt)))
    assert lp == [None, -0.1, -0.1, -0.1]
    (req,) = fake.samples
    assert req["return_prompt_logprobs"] is True and req["sampling_params"]["max_tokens"] == 1


def test_saved_weights_are_sampled_by_trio_uri(service, fake):
    uri = "trio://tr_1/save_weights/step_000001"
    sampler = service.create_sampling_client(model_path=uri)
    assert isinstance(sampler, pytrio.SamplingClient)
    assert fake.sampling_runs[-1] == {"base_model": BASE_MODEL, "source_checkpoint_uri": uri}
    with pytest.raises(ValueError, match="trio://"):
        service.create_sampling_client(model_path="/tmp/local/adapter")


def test_tokenizer_comes_from_pytrio_once_a_client_exists(service, fake):
    service.create_lora_training_client(rank=32, seed=0)
    tok = service.get_tokenizer()
    assert len(tok) == len(fake.tokenizer) and tok.chat_template == fake.tokenizer.chat_template
    assert service.get_tokenizer() is tok


def test_tokenizer_before_any_training_client_comes_from_the_base_sampler(
    fake, logged_in, tmp_path, monkeypatch
):
    """No HF hub: pytrio loads the tokenizer of the id Control resolved (``fake.model_id``,
    a local folder here), not ``model.hf_id`` (a hub id nobody may download here)."""
    import transformers

    hub = transformers.AutoTokenizer.from_pretrained

    def no_hub(name, *args, **kwargs):
        assert name != BASE_MODEL, "the tokenizer must not come from the hub id"
        return hub(name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    svc = TrioService(engine_cfg(), model_cfg(chat_template="{{ 'x' }}"), tmp_path)
    try:
        tok = svc.get_tokenizer()
        assert len(tok) == len(fake.tokenizer) and tok.chat_template == "{{ 'x' }}"
        assert [r["base_model"] for r in fake.sampling_runs] == [BASE_MODEL]
        assert fake.training_runs == []
        assert svc.create_sampling_client() is svc._base_sampler  # reused, not a second run
        assert svc.get_tokenizer() is tok and len(fake.sampling_runs) == 1
    finally:
        svc.close()


# ------------------------------------------------------------- a lab step, end to end


def lab_policy(tokenizer):
    """First turn: one search tool call; after a tool response: alternately right and wrong."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answers = itertools.cycle(["Paris", "Rome"])

    def policy(prompt: list[int], i: int) -> list[int]:
        text = tokenizer.decode(prompt, skip_special_tokens=False)
        if text.count("<tool_response>") == 0:
            reply = ("<tool_call>\n<function=search>\n<parameter=query>\ncapital of France\n"
                     "</parameter>\n</function>\n</tool_call>")
        else:
            reply = f"Answer: {next(answers)}"
        return tokenizer.encode(reply, add_special_tokens=False) + [stop]

    return policy


def lab_run_cfg(group_size: int, turn_tokens: int, **trainer):
    """The lab's algorithm on the fake PyTRIO server: em_format, group_mean, one eval question."""
    cfg = lab_cfg(**trainer)
    cfg.engine = OmegaConf.structured(engine_cfg())
    cfg.model = model_cfg()
    cfg.reward = RewardConfig(name="em_format")
    cfg.advantage = AdvantageConfig(name="group_mean")
    cfg.rollout = RolloutConfig(group_size=group_size, max_trajectory_tokens=8192,
                                max_turn_tokens=turn_tokens, max_observation_tokens=turn_tokens)
    cfg.eval.max_questions = 1
    cfg.eval.before_training = False
    return cfg


def test_trainer_runs_a_lab_step_on_pytrio(service, fake, tok_dir, tmp_path):
    fake.policy = lab_policy(fake.tokenizer)
    cfg = lab_run_cfg(4, 1024, steps=1, questions_per_step=2)
    qs = [QAExample(id=f"q{i}", question="What is the capital of France?",
                    golden_answers=("Paris",), data_source="nq") for i in range(3)]
    protocol = ToolCallProtocol(AutoTokenizer.from_pretrained(tok_dir))  # hf_id is not local here
    rollout = RolloutEngine(protocol, SlowRetriever(delay=0.0), 3, cfg.rollout)
    trainer = Trainer(cfg, tmp_path, service, Dataset(qs, qs[:1], []), rollout,
                      build_reward(RewardConfig(name="em_format")), tracker=_NullTracker(),
                      build_runner=build_step_runner)
    summary = asyncio.run(trainer.run())

    assert summary["steps"] == 1.0 and summary["trained_tokens"] > 0
    kinds = [e["type"] for e in fake.events]
    assert kinds[0] == "trainer.init_run" and "trainer.optimize_step" in kinds
    assert kinds.count("trainer.save_state") == 1
    first_turns = [s for s in fake.samples if s["num_samples"] == 4]
    assert len(first_turns) == 2  # one shared first turn per question, group of 4
    later = [s for s in fake.samples if s["num_samples"] == 1]
    assert later and all(s["sampling_params"]["max_tokens"] == 1024 for s in later)
    state = resolve_resume("auto", tmp_path)
    assert state.engine_state.startswith("trio://") and state.sampler_weights.startswith("trio://")

    service.create_training_client_from_state_with_optimizer(state.engine_state)
    assert fake.training_runs[-1]["source_checkpoint_uri"] == state.engine_state
    assert fake.training_runs[-1]["restore_optimizer"] is True


class _NullTracker:
    def log(self, metrics, step):
        pass
