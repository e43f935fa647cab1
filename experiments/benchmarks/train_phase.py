"""The RL step's train phase alone, at the size of a world step, with its profile.

Builds the engine and the step runner from the config (default ``experiment=paper_grpo_world``:
recomputed old log-probs, reference log-probs, the actor objective with exact entropy and KL
in the loss, 2 optimizer steps) on a random-weight model of a named shape
(``searchr1/engines/local/shapes.py``; default ``smollm2_135m``, the embedded model's size),
and runs ``StepRunner.train`` on a step batch shaped like the study's measured steps
(``--datums`` 128 trajectories of ``--length`` 627 tokens: a 300-token prompt, then turns of
40 sampled and 60 retrieved tokens; 120 trained tokens each). Random token ids: the cost of
the passes does not depend on the values.

The figure is the train phase as the step runs it (the custom objective's gradient in one
pass per micro-batch); the reference, in the same run on the same batch, is the two-pass
custom-loss contract (score every micro-batch, then push the loss's gradient back through
each). ``--compare compile`` instead times ``trainer.compile_layers`` on (the figure) against
off (the reference) on the same client and batch; ``--compare checkpointing`` times
``trainer.activation_checkpointing`` off (the figure) against on (the reference), both at the
run's ``trainer.max_padded_tokens_per_microbatch`` (give one whose activations fit without
recomputation: 6000 tokens at the 3B shape under full fine-tuning; 12000 is refused);
``--compare old_logprobs`` times mini-batch 0 taking its ratio baseline from its own forward
(the figure: the recompute pass scores the later mini-batches only) against recomputing every
datum's old log-probs first (the reference). Medians of ``--repeats`` after one warm-up. ``--profile`` adds torch.profiler's
table of the phase (top ops by device time and by host time) for one more repeat.

    python3 experiments/benchmarks/train_phase.py --tokenizer .gpu/tok --profile       # GPU
    python3 experiments/benchmarks/train_phase.py --tokenizer .gpu/tok --compare compile
    python3 experiments/benchmarks/train_phase.py --tokenizer .gpu/tok --compare old_logprobs
    python3 experiments/benchmarks/train_phase.py --tokenizer .gpu/tok --shape qwen2_5_3b --compare checkpointing \
      --datums 20 --group 5 --length 3000 --repeats 2 -- model.tuning=full trainer.compile_layers=true \
      trainer.max_padded_tokens_per_microbatch=6000
    uv run python experiments/benchmarks/train_phase.py --device cpu --shape tiny --datums 8 --repeats 1
    uv run python experiments/benchmarks/train_phase.py --device cpu --shape smollm2_135m --layers 4 \
      --datums 32 --group 8 --repeats 5 --compare old_logprobs -- trainer.minibatch_trajectories=16
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

import numpy as np
import torch


def step_batch(datums: int, length: int, group: int, seed: int = 0):
    """A step batch of ``datums`` trajectories (groups of ``group``) shaped as module docstring."""
    from searchr1.data.types import QAExample
    from searchr1.batch.step_batch import build_step_batch
    from searchr1.rollout.types import Trajectory

    rng = np.random.default_rng(seed)
    prompt = min(300, length // 2)
    turn = [1] * 40 + [0] * 60
    mask = ([0] * prompt + turn * (length // len(turn) + 1))[:length]
    ex = QAExample(id="q", question="?", golden_answers=("a",), data_source="bench")
    trajs = []
    for d in range(datums):
        t = Trajectory(ex, d % group, rng.integers(0, 1000, length).tolist(), list(mask),
                       [(-0.5 * m) for m in mask], prompt)
        t.reward = float(rng.random() < 0.5)
        trajs.append(t)
    groups = [d // group for d in range(datums)]
    rewards = [np.array([trajs[g * group + m].reward for m in range(group)]) for g in range(datums // group)]
    return lambda: build_step_batch(trajs, groups, [d % group for d in range(datums)], rewards, datums, 10**6)


def two_pass(monkey: bool):
    """Strip the objective's separable form (the reference path) or restore it."""
    import searchr1.loop.update as update

    if not hasattr(two_pass, "original"):
        two_pass.original = update.objective

    def plain(*args, **kwargs):
        fn = two_pass.original(*args, **kwargs)
        del fn.separable
        return fn

    update.objective = plain if monkey else two_pass.original


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2_135m")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--datums", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--length", type=int, default=627)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: the embedded one)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compare", choices=("objective", "compile", "checkpointing", "old_logprobs"),
                    default="objective",
                    help="objective: one pass vs the two-pass custom loss; compile: compile_layers on vs off; "
                         "checkpointing: activation checkpointing off vs on; old_logprobs: mini-batch 0 "
                         "on-policy vs every old log-prob recomputed")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = ap.parse_args()

    from hydra import compose, initialize_config_dir

    from searchr1.build import build_engine, build_step_runner
    from searchr1.config import register_configs
    from searchr1.engines.local.shapes import saved_tokenizer, write_shape

    root = Path(tempfile.mkdtemp(prefix="train-phase-"))
    tok = saved_tokenizer(args.tokenizer) if args.tokenizer else None
    model_dir = write_shape(args.shape, root / "model", args.layers, tokenizer=tok,
                            device="cuda" if args.device.startswith("cuda") else "cpu")
    register_configs()
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(str(conf), version_base=None):
        cfg = compose("config", overrides=[
            "experiment=paper_grpo_world", f"model.hf_id={model_dir}", "model.gguf_file=null", "warmstart=none",
            f"engine.device={args.device}", f"rollout.group_size={args.group}", "model.lora_rank=8",
            "model.lora_alpha=16", *args.overrides])
    service = build_engine(cfg, root / "run")
    runner = build_step_runner(cfg, None, None, service)
    client = service.create_lora_training_client(rank=cfg.model.lora_rank, seed=0)
    make = step_batch(args.datums, args.length, args.group)
    lr_at = lambda k: 1e-6

    names = {"objective": ("one pass", "two pass"), "compile": ("compiled", "eager"),
             "checkpointing": ("kept", "recomputed"), "old_logprobs": ("on-policy", "all recomputed")}[args.compare]

    peaks: dict[str, list[float]] = {}  # GiB allocated at the peak of each call, per path

    def once(reference: bool) -> tuple[float, dict]:
        if args.compare == "compile":
            client.passes.compile_layers = not reference
        elif args.compare == "checkpointing":
            client.passes.recompute = reference
        elif args.compare == "old_logprobs":
            runner.first_minibatch_on_policy = not reference
        else:
            two_pass(reference)
        batch = make()
        sync(args.device)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        metrics = asyncio.run(runner.train(client, batch, 0, lr_at))
        sync(args.device)
        seconds = time.perf_counter() - t0
        if args.device.startswith("cuda"):
            peaks.setdefault(names[1] if reference else names[0], []).append(torch.cuda.max_memory_allocated() / 2**30)
        return seconds, metrics

    once(False), once(False), once(True)  # warm-up (allocator, kernels, compiles) for both paths
    times = {names[0]: [], names[1]: []}
    metrics = {}
    for _ in range(args.repeats):
        for name, ref in ((names[0], False), (names[1], True)):
            t, m = once(ref)
            times[name].append(t)
            metrics.setdefault(name, m)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = args.datums * (args.length - 1)
    dev = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"\ntrain phase, {args.shape}, {args.datums} datums × {args.length} tokens ({tokens} per pass), "
          f"{dev}, medians of {args.repeats}")
    print(f"{'figure':44s} {'s':>8s}  {'reference':28s} {'s':>8s}  {'ratio':>6s}")
    a, b = names
    labels = {"one pass": "train phase (objective in one pass)", "two pass": "two-pass custom loss",
              "compiled": "train phase, compiled layers", "eager": "eager layers",
              "kept": "train phase, activations kept", "recomputed": "activation checkpointing",
              "on-policy": "train phase, mini-batch 0 on-policy", "all recomputed": "every old log-prob recomputed"}
    print(f"{labels[a]:44s} {med[a]:8.3f}  {labels[b]:28s} {med[b]:8.3f}  {med[a] / med[b]:6.2f}")
    print(f"tokens/s over the phase ({a}): {tokens / med[a]:,.0f};  "
          f"train/mfu (update): {metrics[a].get('train/mfu', float('nan')):.3f};  "
          f"train/loss {metrics[a].get('train/loss'):.6g} vs {metrics[b].get('train/loss'):.6g} "
          "(successive calls on one client: its weights move between them, so not equal)")
    if peaks:
        print("peak GPU memory allocated, GiB: " + ", ".join(f"{k} {max(v):.1f}" for k, v in peaks.items()))
    result = {"args": vars(args), "device": dev, "seconds": times, "median": med, "peak_gib": peaks,
              "metrics": {k: {kk: vv for kk, vv in v.items() if isinstance(vv, float)} for k, v in metrics.items()}}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        with profile(activities=acts) as prof:
            once(False)
        key = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=25)
        print(table)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        result["profile"] = table
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
