"""trio_pipeline — an engine=trio mini-batch, call by call (before) vs pipelined (now).

pytrio 0.2.9's real training client against ``tests/helpers/trio_actor.QueuedTrio``, the fake
PyTRIO server of ``tests/helpers/trio_fake.py`` with a latency model: the Actor accepts a
training event at once, runs the events one at a time in arrival order (forward_backward
``--fb-latency`` s, optim_step ``--optim-latency`` s) and answers pytrio's long poll when
the event has run; every request spends ``--rtt`` s on the network. Each run is one
``StepRunner.train`` (the lab's importance_sampling, built-in loss) over a batch of random
trajectories cut into ``--minibatches`` optimizer steps, on a fresh training run.

Schedules, both run by the same code in this process, alternately:
- call by call (the loop before pipelining): the client is wrapped in ``Sequential``, so
  every forward_backward / optim_step returns only once its result is in;
- pipelined: the client as is; ``StepRunner.train`` queues mini-batch k's forward_backward
  and optim_step before it awaits mini-batch k-1's results.

Figures, medians over ``--repeats``: a mini-batch = ``train``'s wall time / mini-batches
(with the update's fill and drain: the first call's preparation, the last result's way back,
the stages before the update); a steady-state mini-batch = the median time between two
optim_steps' ends on the Actor; the Actor's idle seconds between its runs, per mini-batch. The last model row
answers a POST only once its event has run (``accept=False``, the model of
``trio_overlap.py``): pytrio then sends one event at a time, so no schedule can overlap.

    uv run python experiments/benchmarks/trio_pipeline.py [--rtt 0.1] [--repeats 3] [--out p.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from searchr1.advantages.config import AdvantageConfig  # noqa: E402
from searchr1.engines.trio import TrioService  # noqa: E402
from searchr1.loop.config import TrainerConfig  # noqa: E402
from searchr1.batch.step_batch import TRAIN_INPUTS  # noqa: E402
from searchr1.loop.train_step import StepRunner, StepSettings  # noqa: E402
from searchr1.loop.update import UpdateSettings  # noqa: E402
from searchr1.losses.config import LossConfig  # noqa: E402
from searchr1.rollout.config import RolloutConfig  # noqa: E402
from tests.engines.test_trio import engine_cfg, model_cfg  # noqa: E402
from tests.helpers.step_batches import random_groups  # noqa: E402
from tests.helpers.trio_actor import FB, OPTIM, QueuedTrio, Sequential  # noqa: E402
from tests.protocols.test_tool_call import FIXTURES, make_tokenizer  # noqa: E402

SCHEDULES = {"call by call": Sequential, "pipelined": lambda client: client}


def measure(tok_dir: Path, vocab: int, args, rtt: float, accept: bool) -> dict[str, list[float]]:
    """Per schedule: seconds per mini-batch and Actor idle seconds per mini-batch, per repeat."""
    from pytrio.config.config import auth_state

    k = args.minibatches
    tcfg = TrainerConfig(minibatch_trajectories=args.groups * args.group_size // k)
    settings = StepSettings(RolloutConfig(group_size=args.group_size), AdvantageConfig(name="group_mean"),
                            UpdateSettings.from_configs(LossConfig(name="importance_sampling"), tcfg), seed=0)
    out = {f"{name} {fig}": [] for name in SCHEDULES for fig in ("s", "period s", "idle s")}
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as run_dir:
        mp.setattr(auth_state, "api_key", "sk-bench")
        mp.setattr(auth_state, "config_error", None)
        fake = QueuedTrio(str(tok_dir), rtt=rtt, accept=accept,
                          compute={FB: args.fb_latency, OPTIM: args.optim_latency}).install(mp)
        service = TrioService(engine_cfg(), model_cfg(), run_dir, tcfg)
        try:
            for _ in range(args.repeats):
                for name, wrap in SCHEDULES.items():
                    batch = random_groups(vocab, args.groups, args.group_size, tuple(args.tokens))
                    client = service.create_lora_training_client(rank=32, seed=0)
                    warm = batch.datums([0], inputs=TRAIN_INPUTS[:1])  # the run's init event, untimed
                    client.forward(warm, "cross_entropy").result()
                    fake.runs.clear()
                    runner = StepRunner(settings, None, None)
                    t0 = time.perf_counter()
                    m = asyncio.run(runner.train(wrap(client), batch, 0, lambda j: 1e-5))
                    out[f"{name} s"].append((time.perf_counter() - t0) / k)
                    out[f"{name} period s"].append(fake.optim_period())
                    out[f"{name} idle s"].append(fake.idle_between_runs() / k)
                    assert m["train/optimizer_steps"] == k
        finally:
            service.close()
    assert not fake.unexpected, fake.unexpected
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt", type=float, nargs="+", default=[0.1], help="network round trip(s), s")
    ap.add_argument("--fb-latency", type=float, default=0.5)
    ap.add_argument("--optim-latency", type=float, default=0.4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs=2, default=[500, 2000], help="trajectory length range")
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    models = [(rtt, True) for rtt in args.rtt] + [(args.rtt[0], False)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = Path(tmp) / "tok"
        tok = make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text())
        tok.save_pretrained(tok_dir)
        for rtt, accept in models:
            label = f"rtt {rtt}" + ("" if accept else ", POST answered when done")
            results[label] = measure(tok_dir, len(tok), args, rtt, accept)
    n = args.groups * args.group_size
    print(f"latency model: forward_backward {args.fb_latency} s, optim_step {args.optim_latency} s; "
          f"{n} trajectories of {args.tokens[0]}-{args.tokens[1]} tokens in {args.minibatches} "
          f"mini-batches; medians of {args.repeats} runs per schedule")
    print("| latency model | figure | value s | reference | value s | ratio |\n|---|---|---:|---|---:|---:|")
    med = {label: {key: statistics.median(v) for key, v in r.items()} for label, r in results.items()}
    rows = (("s", "mini-batch (train s / mini-batches)"), ("period s", "steady-state mini-batch"),
            ("idle s", "Actor idle / mini-batch"))
    for label, m in med.items():
        for key, figure in rows:
            p, c = m[f"pipelined {key}"], m[f"call by call {key}"]
            print(f"| {label} | pipelined {figure} | {p:.3f} | call by call | {c:.3f} | {p / max(c, 1e-9):.3f} |")
    head = med[f"rtt {args.rtt[0]}"]
    for key, figure in rows[:2]:
        ratio = head[f"pipelined {key}"] / head[f"call by call {key}"]
        print(f"target pipelined / call-by-call {figure} <= 0.75 (rtt {args.rtt[0]}): "
              f"{'met' if ratio <= 0.75 else 'NOT met'} ({ratio:.3f})")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "out"},
                                        "runs": results, "medians": med}, indent=2))


if __name__ == "__main__":
    main()
