"""Tiny-model training runs against the fake Zhihu server, and what reached the update.

Two ways to run, both with ``retriever=zhihu`` pointed at a ``FakeZhihu`` and the keys read
from the environment variable the config names (``ZHIHU_SEARCH_KEYS``), never from config:

- ``run_in_process``: the real ``Trainer`` on a tiny random model, with ``spy`` recording
  every rollout group the step produced and the token sequence of every datum handed to the
  training client's ``forward_backward``; ``FaultRun`` then maps each trained datum back to
  its trajectory and each trajectory's searches to what the server served, so "trained
  datums from failed searches" is counted from the server's log, not from the client's view;
- ``run_mains``: ``python -m searchr1.main`` in subprocesses (Hydra, start-up checks, the
  breaker's exit code and resume hint, ``summary.json``), with two patches: the protocol is
  ``TinySearchProtocol``, because a random tiny model never writes the tags of a real one,
  and the reward is ``vowel_reward``, because EM on such text is always 0 (every group
  degenerate, nothing trained). Optionally the same spy runs inside and dumps its record.

The protocol makes a random model search: ``search_every_turn`` searches on every turn (the
breaker runs need searches); otherwise a turn searches unless its text's code points sum to
a multiple of 3, and the last turn's text is the answer, scored by its share of vowels, so
groups differ in reward and a failed trajectory would carry a gradient if it were trained.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.protocols.base import Action, ActionKind, Observation, Protocol
from searchr1.rollout.types import Trajectory
from tests.helpers.fake_zhihu import FakeZhihu

ROOT = Path(__file__).resolve().parents[3]
KEYS_ENV = "ZHIHU_SEARCH_KEYS"  # ZhihuConfig.keys_env's default
#: canary keys: a test fails if either string shows up in any run file or process output
CANARY_KEYS = ("zk-CANARY-4f1d9a7e-alpha", "zk-CANARY-b83c02d5-bravo")
#: the client's settings for the fake server: short backoff, one retry, no ``.env`` file
SEARCHES_PER_STEP = 4  # main_overrides' default: 2 questions × 2 trajectories × one search
GRACE_STEPS = 1  # main_overrides' trainer.breaker.grace_steps
ZHIHU_SETTINGS = {"timeout_s": 1.5, "max_retries": 1, "backoff_s": 0.01, "env_file": None,
                  "default_retry_after_s": 0.0, "max_key_wait_s": 5.0}


class TinySearchProtocol(Protocol):
    """A plain-text protocol a random char-level model follows (see the module docstring)."""

    stop = ["\n"]

    def __init__(self, tokenizer, search_every_turn: bool = False) -> None:
        self.tok = tokenizer
        self.search_every_turn = search_every_turn

    def initial_prompt(self, question: str) -> list[int]:
        return self.tok.encode(f"Q: {question}\nA:", add_special_tokens=False)

    def parse_action(self, text: str) -> Action:
        body = text.strip()
        if self.search_every_turn or sum(map(ord, body)) % 3:
            return Action(ActionKind.SEARCH, query=f"q {body}")
        return Action(ActionKind.ANSWER, answer=body)

    def observation_tokens(self, sampled, observation: Observation, max_tokens: int):
        if observation.error or observation.invalid:
            text = "\n[error]\nA:"
        else:
            text = "\n[" + " | ".join(d.title[:24] for d in observation.documents) + "]\nA:"
        return self.tok.encode(text, add_special_tokens=False)[:max_tokens], text

    def final_answer(self, turn_texts: list[str]) -> str | None:
        return turn_texts[-1].strip() if turn_texts else None

    def is_valid_format(self, turn_texts, observations=None) -> bool:
        return True


def vowel_reward(inp) -> float:
    """Share of vowels in the answer: differs between samples, so groups carry signal."""
    text = inp.answer or ""
    return sum(c in "aeiou" for c in text) / max(len(text), 1)


def build_tiny_model(out: Path) -> Path:
    """A 2-layer random Llama with a char tokenizer, as ``tests/conftest.py``'s fixture."""
    import string

    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (out / "config.json").exists():
        return out
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *chars])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<unk>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=False, pad_token_id=0,
                      eos_token_id=1, bos_token_id=1)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ---- in process -------------------------------------------------------------------------


def executed_queries(traj: Trajectory) -> tuple[str, ...]:
    """The queries of the searches ``traj`` ran (a search turn that got an observation)."""
    return tuple(t.action.query or "" for t in traj.turns
                 if t.action.kind is ActionKind.SEARCH and t.observation_len > 0)


@dataclass(frozen=True)
class TrajRecord:
    """What the fault matrix needs of one trajectory: its searches and its datum's input."""

    queries: tuple[str, ...]  # executed searches, as sent to the server
    tokens: tuple[int, ...]  # tokens_T[:-1]: a datum's model_input (never truncated here)

    @classmethod
    def of(cls, traj: Trajectory) -> TrajRecord:
        return cls(executed_queries(traj), tuple(traj.tokens_T[:-1]))


@dataclass
class FaultRun:
    """What one run did: its groups, trained datums, metric rows and ending."""

    groups: list[list[list[TrajRecord]]] = field(default_factory=list)  # per step, per group
    trained: list[tuple[int, ...]] = field(default_factory=list)  # model_input of each datum
    rows: list[tuple[int, dict]] = field(default_factory=list)  # (step, metrics) as logged
    final: dict | None = None  # the trainer's summary (None when it stopped early)
    stopped: BaseException | None = None  # the SearchOutage, when the breaker stopped it

    @property
    def trajectories(self) -> list[TrajRecord]:
        return [t for step in self.groups for g in step for t in g]

    def train_rows(self) -> list[tuple[int, dict]]:
        return [(s, m) for s, m in self.rows if "reward/mean" in m]

    def total(self, key: str) -> float:
        return sum(m.get(key, 0.0) for _, m in self.train_rows())

    def failed_by_server(self, server: FakeZhihu) -> list[TrajRecord]:
        """Trajectories with a search the server never answered with documents: it served
        only faults for the query, or never saw it (the client had no usable key left)."""
        answered = server.answered_queries()
        return [t for t in self.trajectories if any(q not in answered for q in t.queries)]

    def datum_sources(self) -> list[list[TrajRecord]]:
        """For each trained datum, the trajectories whose tokens it is (normally one)."""
        by_tokens: dict[tuple[int, ...], list[TrajRecord]] = {}
        for t in self.trajectories:
            by_tokens.setdefault(t.tokens, []).append(t)
        return [by_tokens.get(tokens, []) for tokens in self.trained]

    def trained_from_failed(self, server: FakeZhihu) -> int:
        """Trained datums that come from a trajectory with a failed search (server's log)."""
        failed = {id(t) for t in self.failed_by_server(server)}
        return sum(any(id(t) in failed for t in src) for src in self.datum_sources())

    def dump(self, path: str | os.PathLike) -> None:
        """The groups and trained datums as JSON (what a subprocess hands back)."""
        groups = [[[[list(t.queries), list(t.tokens)] for t in g] for g in step]
                  for step in self.groups]
        Path(path).write_text(json.dumps({"groups": groups, "trained": self.trained}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> FaultRun:
        """A run from ``dump``'s file (groups and trained datums only)."""
        raw = json.loads(Path(path).read_text())
        groups = [[[TrajRecord(tuple(q), tuple(tok)) for q, tok in g] for g in step]
                  for step in raw["groups"]]
        return cls(groups=groups, trained=[tuple(t) for t in raw["trained"]])


class _Rows:
    """A tracker keeping every logged row."""

    def __init__(self, rows: list) -> None:
        self.rows = rows

    def log(self, metrics, step) -> None:
        self.rows.append((step, dict(metrics)))


@contextlib.contextmanager
def spy(run: FaultRun) -> Iterator[FaultRun]:
    """Record each step's groups and the inputs of every ``forward_backward`` into ``run``."""
    from searchr1.engines.local.training.client import LocalTrainingClient
    from searchr1.loop import train_step

    rollout_stage = train_step.rollout_stage
    originals = {n: getattr(LocalTrainingClient, n)
                 for n in ("forward_backward", "forward_backward_custom")}

    async def recording_rollout(*args, **kwargs):
        groups = await rollout_stage(*args, **kwargs)
        run.groups.append([[TrajRecord.of(t) for t in g] for g in groups])
        return groups

    def recording(name):
        def call(self, data, *args, **kwargs):
            run.trained.extend(tuple(d.model_input.to_ints()) for d in data)
            return originals[name](self, data, *args, **kwargs)
        return call

    train_step.rollout_stage = recording_rollout
    for name in originals:
        setattr(LocalTrainingClient, name, recording(name))
    try:
        yield run
    finally:
        train_step.rollout_stage = rollout_stage
        for name, fn in originals.items():
            setattr(LocalTrainingClient, name, fn)


def tiny_config(model_dir: Path, steps: int, policy: str, url: str, **breaker):
    """The root config of a tiny in-process run with ``retriever=zhihu`` at ``url``."""
    from omegaconf import OmegaConf

    from searchr1.config import Config
    from searchr1.engines.local.model import LocalEngineConfig, ModelConfig
    from searchr1.losses.config import LossConfig
    from searchr1.retrievers.zhihu import ZhihuConfig
    from searchr1.rewards import RewardConfig
    from searchr1.advantages.config import AdvantageConfig
    from searchr1.loop.config import BreakerConfig, TrainerConfig
    from searchr1.rollout.config import RolloutConfig

    cfg = OmegaConf.structured(Config)
    cfg.engine = OmegaConf.structured(LocalEngineConfig(device="cpu", batch_window_ms=1.0))
    cfg.model = ModelConfig(name="tiny", hf_id=str(model_dir), gguf_file=None, lora_rank=4,
                            lora_alpha=8)
    cfg.retriever = OmegaConf.structured(ZhihuConfig(base_url=url, **ZHIHU_SETTINGS))
    cfg.reward = RewardConfig()
    cfg.advantage = AdvantageConfig(name="grpo_std")
    cfg.loss = LossConfig(name="ppo")
    cfg.rollout = RolloutConfig(group_size=3, max_turns=3, max_searches=2, max_turn_tokens=10,
                                max_trajectory_tokens=160, on_tool_error=policy)
    cfg.trainer = TrainerConfig(steps=steps, questions_per_step=4, learning_rate=5e-2,
                                breaker=BreakerConfig(**breaker))
    cfg.eval.max_questions = 1
    cfg.eval.before_training = False
    return cfg


def tiny_dataset():
    """Eight questions; answers do not matter to the vowel reward."""
    from searchr1.data.types import Dataset, QAExample

    qs = [QAExample(id=f"q{i}", question=f"who founded city {i}", golden_answers=("a",),
                    data_source="fake") for i in range(8)]
    return Dataset(train=qs, dev=qs[:1], test=[])


def run_in_process(model_dir: Path, run_dir: Path, server: FakeZhihu, policy: str,
                   steps: int = 3, **breaker) -> FaultRun:
    """A tiny run of the real trainer against ``server``; keys come from ``$KEYS_ENV``."""
    from searchr1.build import build_retriever, build_step_runner, loop_limits
    from searchr1.engines.local.service import LocalService
    from searchr1.loop.breaker import SearchOutage
    from searchr1.loop.trainer import Trainer
    from searchr1.rollout.engine import RolloutEngine

    cfg = tiny_config(model_dir, steps, policy, server.url, **breaker)
    data = tiny_dataset()
    retriever = build_retriever(cfg.retriever, data)  # ZhihuRetriever, keys from the environment
    service = LocalService(cfg.engine, cfg.model, run_dir, loop_limits(cfg.trainer))
    rollout = RolloutEngine(TinySearchProtocol(service.get_tokenizer()), retriever,
                            cfg.retriever.topk, cfg.rollout)
    run = FaultRun()
    trainer = Trainer(cfg, run_dir, service, data, rollout, vowel_reward, _Rows(run.rows),
                      build_runner=build_step_runner)

    async def go():
        try:
            return await trainer.run()
        finally:
            await retriever.aclose()

    with spy(run):
        try:
            run.final = asyncio.run(go())
        except SearchOutage as err:
            run.stopped = err
    return run


# ---- python -m searchr1.main --------------------------------------------------------------

SPY_ENV = "FAULT_RUN_SPY"  # run_mains: where the subprocess dumps its FaultRun
MIXED_ENV = "FAULT_RUN_MIXED"  # run_mains: "1" = TinySearchProtocol's mixed search/answer turns
_MAIN = f"""
import atexit, os, runpy
import searchr1.build as build
from tests.helpers.fault_run import FaultRun, TinySearchProtocol, spy, vowel_reward
every = os.environ.get("{MIXED_ENV}") != "1"
build.build_protocol = lambda cfg, tokenizer: TinySearchProtocol(tokenizer, search_every_turn=every)
build.build_reward = lambda cfg: vowel_reward
if os.environ.get("{SPY_ENV}"):
    run = FaultRun()
    recording = spy(run)  # held: a collected context manager would undo its patches
    recording.__enter__()
    atexit.register(lambda: run.dump(os.environ["{SPY_ENV}"]))
runpy.run_module("searchr1.main", run_name="__main__", alter_sys=True)
"""


def main_overrides(model_dir: Path, url: str, steps: int = 6, questions: int = 2, group: int = 2,
                   max_turns: int = 2, max_searches: int = 1) -> list[str]:
    """A tiny ``python -m searchr1.main`` run on ``retriever=zhihu`` at ``url`` (a Hydra sweep
    list of URLs works too). By default 2 questions × 2 trajectories of exactly one search
    each per step (``SEARCHES_PER_STEP``), and always a breaker of window 1 and grace 1 step.
    The caller adds ``hydra.run.dir`` (or ``-m hydra.sweep.dir``)."""
    client = [f"retriever.{k}={'null' if v is None else v}" for k, v in ZHIHU_SETTINGS.items()]
    return ["model.name=tiny", f"model.hf_id={model_dir}", "model.gguf_file=null",
            "model.lora_rank=4", "model.lora_alpha=8", "engine.device=cpu", "warmstart=none",
            "retriever=zhihu", f"retriever.base_url={url}", *client, f"trainer.steps={steps}",
            f"trainer.questions_per_step={questions}", f"rollout.group_size={group}",
            f"rollout.max_turns={max_turns}", f"rollout.max_searches={max_searches}",
            "rollout.max_turn_tokens=8", "rollout.max_trajectory_tokens=256",
            "eval.before_training=false", "eval.max_questions=1", "trainer.breaker.window=1",
            f"trainer.breaker.grace_steps={GRACE_STEPS}"]




@dataclass
class MainProcess:
    """A started ``python -m searchr1.main`` and the files its output goes to."""

    cmd: list[str]
    proc: subprocess.Popen
    stdout: Path
    stderr: Path

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        """Its result (killed past ``timeout`` seconds, then ``TimeoutExpired``)."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        return subprocess.CompletedProcess(self.cmd, self.proc.returncode,
                                           self.stdout.read_text(), self.stderr.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_mains(runs: Sequence[Sequence[str]], log_dir: Path, keys: Sequence[str] = CANARY_KEYS,
                mixed: bool = False, spy_runs: bool = False) -> list[MainProcess]:
    """Start ``python -m searchr1.main`` once per override list, all at once, with the keys
    in ``$KEYS_ENV`` only. The protocol is ``TinySearchProtocol`` (``mixed``: mixed search
    and answer turns, else a search every turn) and the reward ``vowel_reward``;
    ``spy_runs``: each run dumps its ``FaultRun`` to ``log_dir/main_<i>.spy.json``
    (``FaultRun.load``). Output goes to files in ``log_dir``, so no pipe can fill up and
    stall a process while another is being waited for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZHIHU_")}
    env.update({KEYS_ENV: ",".join(keys), MIXED_ENV: "1" if mixed else "0"})
    log_dir.mkdir(parents=True, exist_ok=True)
    started = []
    for i, overrides in enumerate(runs):
        out, err = log_dir / f"main_{i}.out", log_dir / f"main_{i}.err"
        cmd = [sys.executable, "-c", _MAIN, *overrides]
        run_env = {**env, SPY_ENV: str(log_dir / f"main_{i}.spy.json")} if spy_runs else env
        with out.open("w") as fout, err.open("w") as ferr:  # the child keeps its own copies
            proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env, stdout=fout, stderr=ferr)
        started.append(MainProcess(cmd, proc, out, err))
    return started


def run_mains(runs: Sequence[Sequence[str]], log_dir: Path, timeout: float = 400,
              **kwargs) -> list[subprocess.CompletedProcess]:
    """``start_mains`` and wait for every run (each within ``timeout`` seconds)."""
    started = start_mains(runs, log_dir, **kwargs)
    try:
        return [m.wait(timeout) for m in started]
    finally:
        for m in started:
            m.kill()


def canary_hits(run_dir: Path, texts: Sequence[str] = (), keys: Sequence[str] = CANARY_KEYS
                ) -> list[str]:
    """Files under ``run_dir`` (and indices of ``texts``) that contain any of ``keys``."""
    needles = [k.encode() for k in keys]
    hits = [str(p) for p in sorted(run_dir.rglob("*"))
            if p.is_file() and any(n in p.read_bytes() for n in needles)]
    return hits + [f"text {i}" for i, t in enumerate(texts) if any(k in t for k in keys)]
