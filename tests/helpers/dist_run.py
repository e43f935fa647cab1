"""Real gloo jobs on 127.0.0.1 for the data-parallel tests: N forked ranks of the trainer.

``run_job(world, …)`` starts ``world`` processes from a ``forkserver`` that imported torch and
the project once (a fresh interpreter spends ~15 s importing on 2 cores), each with
torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR/PORT`` on a free
port), so ``searchr1.distributed.launch.init`` joins a real gloo group. Each rank runs the
real ``Trainer`` on a tiny random model (every turn an answer, scored by its share of
vowels, so groups differ) and writes its adapters and metric rows to ``out``. ``world=1``
sets no environment: the plain one-process path.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import socket
from pathlib import Path

# *_full: model.tuning=full (FSDP2 under torchrun); grpo_recompute: the paper presets' recomputed
# old log-probs with a custom objective (entropy bonus), where mini-batch 0 scores its own baseline
ALGOS = ("grpo", "ppo", "lab", "grpo_full", "grpo_recompute")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cfg(model_dir: Path, algo: str, questions: int, steps: int = 2, **trainer):
    """Two optimizer steps per rollout (mini-batch = half the trajectories), fp32 on CPU."""
    from searchr1.advantages.config import AdvantageConfig, CriticConfig
    from searchr1.losses.config import LossConfig
    from tests.loop.test_trainer import make_cfg as base

    cfg = base(model_dir, steps=steps, **trainer)
    if algo.endswith("_full"):
        cfg.model.tuning = "full"
        algo = algo.removesuffix("_full")
    cfg.engine.max_batch_size = 1  # a request's logits never depend on what it is batched with
    # nor on which earlier turn's KV a process happens to hold (reuse equals a full prefill
    # only up to float rounding, and AdamW magnifies that in weights whose gradient is ~0)
    cfg.engine.prefix_cache_tokens = 0
    cfg.rollout.group_size = 2
    cfg.trainer.questions_per_step = questions
    if algo == "ppo":
        cfg.advantage = AdvantageConfig(name="ppo_gae")
        cfg.critic = CriticConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-2, warmup_ratio=0.0,
                                  device="cpu", microbatch_trajectories=2)
        cfg.rollout.group_size = 1
    elif algo == "lab":
        cfg.advantage = AdvantageConfig(name="group_mean")
        cfg.loss = LossConfig(name="importance_sampling", aggregation="seq_mean_token_mean")
    elif algo == "grpo_recompute":
        cfg.loss = LossConfig(name="ppo", aggregation="microbatch_token_mean", old_logprobs="recompute",
                              entropy_coef=1e-3)
        cfg.trainer.microbatch_trajectories = 3
    else:
        cfg.loss = LossConfig(name="ppo", aggregation="microbatch_token_mean")
        cfg.trainer.microbatch_trajectories = 3  # loss micro-batches that straddle ranks
    cfg.trainer.minibatch_trajectories = trainer.get("minibatch_trajectories",
                                                     questions * cfg.rollout.group_size // 2)
    return cfg


def dataset(n: int = 24):
    from searchr1.data.types import Dataset, QAExample

    qs = [QAExample(id=f"q{i}", question=f"question {i}", golden_answers=("a",), data_source=f"s{i % 3}")
          for i in range(n)]
    return Dataset(train=qs, dev=qs[:5], test=[])


class _Null:
    def log(self, metrics, step) -> None:
        pass


def rank_main(rank: int, world: int, port: int, model_dir: str, run_dir: str, out: str,
              algo: str, questions: int, trainer: dict, env: dict) -> None:
    """One rank (a forked child): train, then dump adapters and metric rows."""
    import torch

    from searchr1.distributed.config import DistributedConfig
    from searchr1.distributed.launch import init, shutdown
    from searchr1.engines.local.service import LocalService
    from searchr1.loop.trainer import Trainer
    from searchr1.rollout.engine import RolloutEngine
    from searchr1.trackers.jsonl import JsonlTracker
    from tests.helpers.rollout_fakes import SlowRetriever
    from tests.loop.test_trainer import TextProtocol, vowel_reward

    os.environ.update({k: v for k, v in env.items() if k != "KILL_RANK"})
    if env.get("KILL_RANK") not in (None, str(rank)):
        os.environ.pop("SEARCHR1_KILL_AT", None)  # only the named rank dies
    if world > 1:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dp = init(DistributedConfig(timeout_s=float(env.get("DIST_TIMEOUT", 60))), "cpu")
    cfg = make_cfg(Path(model_dir), algo, questions, **trainer)
    service = LocalService(cfg.engine, cfg.model, run_dir, cfg.trainer, dp)
    rollout = RolloutEngine(TextProtocol(service.get_tokenizer()), SlowRetriever(0.0), 1, cfg.rollout)
    tracker = JsonlTracker(run_dir) if dp.is_rank0 else _Null()
    trainer_obj = Trainer(cfg, Path(run_dir), service, dataset(), rollout, vowel_reward, tracker, dp)
    from searchr1.distributed.context import RankLost
    from searchr1.main import EXIT_CODES

    try:
        final = asyncio.run(trainer_obj.run())
    except RankLost as err:  # what main.py prints to stderr
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"lost_{rank}.txt").write_text(err.message)
        raise
    except tuple(EXIT_CODES) as err:  # a stop signal, a search outage, a full disk: main.py's code
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"stopped_{rank}.json").write_text(json.dumps({"step": getattr(err, "step", None),
                                                                     "reason": err.reason}))
        raise SystemExit(EXIT_CODES[type(err)]) from err
    full = service.training.tuning == "full"  # every weight (each rank's gathered copy)
    state = {k: v.detach().clone() for k, v in service.training.model.named_parameters()
             if full or "lora_" in k}
    if trainer_obj.critic is not None:
        state.update({f"critic.{k}": v.detach().clone() for k, v in trainer_obj.critic.model.named_parameters()
                      if "lora_" in k})
        state.update({f"critic.head.{k}": v.detach().clone() for k, v in trainer_obj.critic.head.named_parameters()})
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(state, Path(out) / f"params_{rank}.pt")
    (Path(out) / f"final_{rank}.json").write_text(json.dumps(final))
    if service.training.masters is not None:  # FSDP2: the zero-loss passes of the lockstep
        (Path(out) / f"idle_{rank}.txt").write_text(str(service.training.masters.idle_passes))
    shutdown()


def start_job(world: int, model_dir: Path, run_dir: Path, out: Path, algo: str, questions: int,
              env: dict | None = None, **trainer) -> list:
    """Start the ranks; returns the processes (``join`` them)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "searchr1.loop.trainer", "tests.loop.test_trainer"])
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, str(model_dir), str(run_dir), str(out),
                                                 algo, questions, trainer, dict(env or {})))
             for r in range(world)]
    for p in procs:
        p.start()
    return procs


def join(procs, timeout: float = 300) -> list[int | None]:
    """Exit codes (killing any rank still alive after ``timeout`` seconds)."""
    import time

    end = time.monotonic() + timeout
    for p in procs:
        p.join(max(end - time.monotonic(), 0.1))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def join_whole_job(procs, timeout: float = 300) -> list[int | None]:
    """Exit codes, as torchrun ends a job: once one rank has failed (a kill, an error), the
    others are SIGKILLed (a rank waiting on a dead peer would otherwise sit out its collective
    timeout); any rank alive after ``timeout`` seconds is killed too."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end and any(p.exitcode is None for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    for p in procs:
        if p.exitcode is None:
            p.kill()
        p.join()
    return [p.exitcode for p in procs]


def run_job(world: int, model_dir: Path, root: Path, algo: str, questions: int, **kw) -> Path:
    """A whole job; asserts every rank exited 0; returns its output folder."""
    run_dir, out = root / "run", root / "out"
    codes = join(start_job(world, model_dir, run_dir, out, algo, questions, **kw))
    assert codes == [0] * world, codes
    return root


def rows(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
