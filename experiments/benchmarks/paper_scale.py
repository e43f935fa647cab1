"""One paper-size RL step on one GPU, with its split and the bounds it is measured against.

The step is the paper's GRPO (``experiment=paper_grpo``'s limits and batch shapes: 512 questions × 5 trajectories,
≤ 4 searches, 500 tokens per turn, 500-token observations, a 4,096-token context) on the
world questions with BM25, through the project's own step code (``build_app`` +
``build_step_runner`` + ``StepRunner.run`` on a composed config). The model is a random-weight
folder of a real shape (``searchr1/engines/local/shapes.py``) driven by the scripted
worst-case policy (``rollout.scripted_policy=search_until_budget``), so every trajectory has
the most turns and tokens the limits allow.

Split: rollout (``time/rollout``), old log-probs (``forward``), reference log-probs
(``compute_reference_logprobs``), update (``forward_backward*`` + ``optim_step``), phase
switches (``Phases.seconds``) and the weight sync (the first sample after the update: the
sampler's bf16 copy is refreshed, and the KV pool re-allocated when it slept).

Bounds, computed in the same run from the loaded model (N = weights used in matmuls: all
parameters, less the input embedding when it is not tied to the LM head; attention's
quadratic term is left out):
- decode: one decode step streams the sampler's weights once (2·N bytes in bf16) at the
  card's bandwidth B (``flops.card``: H200 4.8 TB/s, H100 3.35) and yields one token per row;
  rows = the KV pool (``engine.kv_slots``; vLLM: ``engine.vllm.max_num_seqs``), at most the
  step's trajectories → bound tokens/s = rows · B / (2·N). That bound leaves
  out the keys and values each row reads at every step (``kv`` bytes per context token =
  layers · 2 · kv_heads · head_dim · 2), which dominate at the paper's contexts; the KV-read
  bound adds them at the mean decode context C: rows · B / (2·N + rows · C · kv). C is
  estimated from the step's mean trajectory (prompt P = length − action − observation tokens;
  a context grows from P to the full length, C ≈ (P + length) / 2, labelled as such);
- training: 6·N FLOPs per token for the update, 2·N per scoring pass, of the card's bf16 dense
  peak (989 TFLOP/s on an H100 or H200); MFU = achieved FLOP/s ÷ peak;
- memory: the GPU's capacity.

    python experiments/benchmarks/paper_scale.py --shape qwen2_5_3b --tuning full --steps 1 --questions 64 --out r.json
    python experiments/benchmarks/paper_scale.py --shape tiny --device cpu --questions 2 --group 2   # smoke

``--profile`` adds the last step's component table of ``profile_step.py`` (sampler admission,
prefill, decode windows, host syncs, search, scoring passes, forward/backward, optimizer).
Where the rollout's time goes is in the table either way: the engine's busy share of the rollout
(slot sampler: decode windows and admission rounds; vLLM: ``step()``), the mean rows it decoded
per step, and the sampled tokens per second of busy time — against which the wall-clock rate
shows what is lost around the engine (turn boundaries, searches, waiting for work).

``--kernels N`` runs the slot sampler's first N admission rounds of the last step under
``torch.profiler`` (``profile_step.KernelProfile``) and prints their kernels by device time against
the rounds' synchronized wall time: whether a round is launch-bound or GPU-bound. The profiler's
start and stop fall inside that step's rollout, so that step is not a timing.

``--standalone`` then times the same sampling client alone, in the same process: random prompts
at the step's mean live rows and mean decode context (a cold call, then a cached repeat; 256 new
tokens at temperature 1), and again at the whole pool. The in-step rate against the first is
the rollout's share of its engine's speed; the second gives the labelled extrapolation of the
paper-size step (512 × 5): every phase but the rollout scaled by trajectories from this step's
per-token rates, the rollout's sampled tokens at the full pool's standalone rate.

``--switch-interval-ms X`` sets CPython's GIL switch interval for the steps (default 5 ms): an
admission round's eager launches come from the sampler's thread while the rollout's main thread
searches and tokenizes (``gil_contention.py`` shows the effect on the CPU).

``--engines slots vllm`` runs the step once per engine (``engine.sampler=…``), each in its own
process, one after the other in this call, and prints both columns with the ratio.

Arguments after ``--`` are extra Hydra overrides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from searchr1.utils.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent  # the sibling benchmarks this one borrows from
#: experiment=paper_grpo's limits and batch shapes (its data group is nq_hotpotqa, so the world
#: run starts from paper_grpo_world, which has the same loss, and takes these over)
PAPER_LIMITS = (
    "rollout.max_searches=4", "rollout.max_turns=5", "rollout.max_turn_tokens=500",
    "rollout.max_observation_tokens=500", "rollout.max_prompt_tokens=4096",
    "rollout.train_truncated_turns=true", "rollout.max_trajectory_tokens=8192",
    "engine.max_seq_len=4596", "retriever.topk=3", "protocol.use_chat_template=true",
    "protocol.cut=official", "protocol.observation_truncation=tokens",
    "trainer.minibatch_trajectories=256", "trainer.microbatch_trajectories=8",
    "trainer.learning_rate=1e-6",
)
#: --device cpu is a smoke check of the code path on 2 cores: short turns and contexts
SMOKE_LIMITS = (
    "rollout.max_turn_tokens=48", "rollout.max_observation_tokens=32", "rollout.max_prompt_tokens=640",
    "rollout.max_trajectory_tokens=1024", "engine.max_seq_len=688", "trainer.minibatch_trajectories=2",
    "trainer.microbatch_trajectories=2",
)
PAPER_TRAJECTORIES = 512 * 5  # the paper's step: 512 questions × 5 trajectories
PAPER_TARGET_S = 480.0  # the paper-size step's target on one H200 (8 minutes)
SPLIT = ("rollout", "old_logprobs", "reference", "update", "weight_sync", "phase_switches")


def overrides(args, model_dir: Path, run_dir: Path) -> list[str]:
    """The composed run: the paper's GRPO step on the world, this shape, the scripted policy."""
    gpu = args.device != "cpu"
    return [
        "experiment=paper_grpo_world", "warmstart=none", *PAPER_LIMITS,
        f"model.hf_id={model_dir}", "model.gguf_file=null", f"model.name={args.shape}",
        f"model.tuning={args.tuning}", f"engine.device={args.device}",
        f"trainer.steps={args.steps}", f"trainer.questions_per_step={args.questions}",
        f"data.train_questions={max(400, args.questions * args.steps)}",
        f"rollout.group_size={args.group}", "rollout.scripted_policy=search_until_budget",
        "eval.before_training=false", "trainer.save_every=0", "trainer.eval_every=0",
        *(["engine.kv_slots=null", "engine.sleep_between_phases=true",
           "engine.activation_checkpointing=true"] if gpu else SMOKE_LIMITS),
        f"hydra.run.dir={run_dir}", *args.overrides,
    ]


def compose(items: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    from searchr1.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=items)


class Timed:
    """Wall seconds of a training client's calls, by split name (futures resolved inside), and
    the tokens each split's calls were given (the old log-prob pass scores only the mini-batches
    after the first: ``UpdateSettings.first_minibatch_on_policy``)."""

    NAMES = {"forward": "old_logprobs", "compute_reference_logprobs": "reference",
             "forward_backward": "update", "forward_backward_custom": "update", "optim_step": "update"}

    def __init__(self, client) -> None:
        self.seconds = dict.fromkeys(SPLIT, 0.0)
        self.tokens = dict.fromkeys(SPLIT, 0)
        for method, name in self.NAMES.items():
            setattr(client, method, self._wrap(getattr(client, method), name))

    def _wrap(self, fn, name: str):
        def timed(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            if hasattr(out, "result"):
                out.result()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - start
            if a and isinstance(a[0], list) and name != "update":  # the Datums this pass scored
                self.tokens[name] += sum(d.model_input.length for d in a[0])
            print(f"paper_scale: {fn.__name__} {time.perf_counter() - start:.1f} s", flush=True)
            return out
        return timed


async def first_sample_seconds(client) -> float:
    """Seconds of a one-token sample right after the update (weight refresh, pool wake)."""
    import pytrio

    start = time.perf_counter()
    sampler = client.save_weights_and_get_sampling_client()
    await sampler.sample_async(prompt=pytrio.ModelInput.from_ints([1, 2, 3]), num_samples=1,
                               sampling_params=pytrio.SamplingParams(max_tokens=1, seed=0))
    return time.perf_counter() - start


async def standalone_rate(client, rows: int, context: int, vocab: int, new: int = 256) -> dict:
    """Sampled tokens/s of ``rows`` random prompts, ``new`` tokens each at temperature 1, through
    the training client's sampler alone (``sampler_throughput``'s prompts and call): a cold call
    (every prompt prefilled), then a cached repeat. The prompts are ``context - new / 2`` tokens,
    so the mean decode context is ``context``."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from sampler_throughput import prompts, sample_all

    sampler = client.save_weights_and_get_sampling_client()
    batch = prompts(rows, vocab, max(1, context - new // 2), seed=11)
    rate = [tokens / seconds for seconds, tokens in [await sample_all(sampler, batch, new) for _ in range(2)]]
    return dict(rows=rows, context=context, new=new, cold_tokens_per_s=rate[0], cached_tokens_per_s=rate[1])


def decode_shape(last: dict) -> tuple[float, float]:
    """(mean decode context, mean rows the engine decoded per step) of a measured step. The
    context is estimated from the mean trajectory: its prompt P = length − action − observation
    tokens, and a context grows from P to the full length, so C ≈ (P + length) / 2."""
    m = last["metrics"]
    length = m.get("rollout/trajectory_tokens", 0.0)
    prompt = length - m.get("rollout/action_tokens", 0.0) - m.get("rollout/search_calls", 0.0) * last["observation_tokens"]
    eng = last.get("engine") or {}
    return (prompt + length) / 2, (eng["row_steps"] / eng["steps"] if eng.get("steps") else 0.0)


def heartbeat(stats, every: float = 30.0) -> None:
    """Print the samplers' counters every ``every`` seconds (a cut run still shows its progress)."""
    import threading

    def beat():
        while True:
            time.sleep(every)
            print(f"paper_scale: sampler {stats()}", flush=True)

    threading.Thread(target=beat, daemon=True, name="paper-scale-heartbeat").start()


async def run_steps(cfg, run_dir: Path, timers=None, standalone: bool = False, kernels=None) -> dict:
    """Build the app, run ``trainer.steps`` steps; the last step's figures and the model facts."""
    from searchr1.build import build_app, build_step_runner
    from searchr1.data.order import DataOrder
    from searchr1.loop.plan import total_optimizer_steps
    from searchr1.engines.local.sampling.slot_model import Dims
    from searchr1.engines.local.training import flops
    from searchr1.utils.lr_schedule import step_lr

    clock = time.perf_counter()
    app = build_app(cfg, run_dir)
    print(f"paper_scale: app built (model loaded) in {time.perf_counter() - clock:.1f} s", flush=True)
    sampler_stats = lambda: [dict(vars(e.stats), engine=type(e).__name__)  # noqa: E731
                             for e in app.service.samplers.engines()]
    heartbeat(sampler_stats)
    n_matmul = flops.matmul_weights(app.service.model)
    dims = Dims.of(app.service.model.config)
    kv_bytes = dims.layers * 2 * dims.kv_heads * dims.head_dim * 2  # bf16 K and V per token
    observed: list[int] = []
    inner = app.rollout.protocol.observation_tokens

    def observation_tokens(*a, **k):
        tokens, text = inner(*a, **k)
        observed.append(len(tokens))
        return tokens, text

    app.rollout.protocol.observation_tokens = observation_tokens
    t = cfg.trainer
    client = app.service.create_lora_training_client(rank=cfg.model.lora_rank, seed=cfg.seed)
    runner = build_step_runner(cfg, app.rollout, app.reward_fn, app.service)
    order = DataOrder(app.dataset.train, cfg.seed, t.data_order)
    lr_for = partial(step_lr, t, total_optimizer_steps(t, cfg.rollout.group_size))
    rows, opt_steps = [], 0
    if timers is not None:
        timers.snapshot()
    for step in range(t.steps):
        timed = Timed(client)
        switches = client.phases.seconds
        observed.clear()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        print(f"paper_scale: step {step + 1} starts (rollout)", flush=True)
        if kernels is not None:
            kernels.armed = step == t.steps - 1  # the last step's first admission rounds
        before = sampler_stats()
        metrics = await runner.run(client, order.slice(step * t.questions_per_step, t.questions_per_step),
                                   step, opt_steps, lr_for(step))
        opt_steps += int(metrics.get("train/optimizer_steps", 0))
        timed.seconds["weight_sync"] = await first_sample_seconds(client)
        timed.seconds["rollout"] = metrics["time/rollout"]
        timed.seconds["phase_switches"] = client.phases.seconds - switches
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        rows.append(dict(metrics=metrics, split=timed.seconds, split_tokens=timed.tokens, peak_bytes=peak,
                         observation_tokens=sum(observed) / max(1, len(observed)),
                         engine=engine_time(before, sampler_stats())))
        print(step_line(step + 1, rows[-1]), flush=True)
        if timers is not None:
            timers.snapshot()
        for name in Timed.NAMES:  # unwrap for the next step's fresh timers
            client.__dict__.pop(name, None)
    if kernels is not None:
        kernels.armed = False  # the standalone calls below are not the step's
    e = app.service.engine_cfg
    kv_slots = e.vllm.max_num_seqs if e.sampler == "vllm" else e.kv_slots
    alone = None
    if standalone:
        context, live = decode_shape(rows[-1])
        vocab = app.service.model.config.vocab_size
        alone = {}
        for name, n in (("live", max(1, round(live))), ("pool", kv_slots)):
            print(f"paper_scale: standalone sampler, {n} rows at context {context:.0f}", flush=True)
            alone[name] = await standalone_rate(client, n, round(context), vocab)
    per_step = [dict(step_s=r["metrics"]["time/step_seconds"], split=r["split"], engine=r["engine"],
                     sampled_tokens=r["metrics"].get("rollout/sampled_tokens", 0.0)) for r in rows]
    return dict(last=rows[-1], first_step_seconds=rows[0]["metrics"]["time/step_seconds"], per_step=per_step,
                n_matmul=n_matmul, kv_slots=kv_slots, limits=cfg.rollout, kv_bytes_per_token=kv_bytes,
                sampler_stats=sampler_stats(), standalone=alone)


def engine_time(before: list[dict], after: list[dict]) -> dict[str, float]:
    """The sampling engine's busy seconds, steps and row-steps between two counter snapshots
    (the slot sampler: decode windows + admission rounds; vLLM: its ``step()`` calls); the
    rollout's own measure-up includes the weight sync and the eval's none."""
    out = dict(busy_s=0.0, steps=0.0, row_steps=0.0, capture_s=0.0, admit_s=0.0)
    for b, a in zip(before, after):
        if a["engine"] == "VllmEngine":
            out["busy_s"] += a["step_seconds"] - b["step_seconds"]
            out["steps"] += a["steps"] - b["steps"]
            out["row_steps"] += a["in_flight_steps"] - b["in_flight_steps"]
        else:
            out["busy_s"] += a["decode_seconds"] + a["admit_seconds"] - b["decode_seconds"] - b["admit_seconds"]
            out["steps"] += a["decode_steps"] - b["decode_steps"]
            out["row_steps"] += a["live_row_steps"] - b["live_row_steps"]
            out["capture_s"] += a["capture_seconds"] - b["capture_seconds"]  # inside busy_s (decode windows)
            out["admit_s"] += a["admit_seconds"] - b["admit_seconds"]
    return out


def step_line(k: int, row: dict) -> str:
    """One step's wall split and engine counters (every step; the table is the last one's)."""
    split, eng = row["split"], row["engine"]
    _, rows = decode_shape(row)
    return (f"paper_scale: step {k}: {row['metrics']['time/step_seconds']:.1f} s (rollout {split['rollout']:.1f}, "
            f"reference {split['reference']:.1f}, update {split['update']:.1f}, weight sync {split['weight_sync']:.2f}); "
            f"engine busy {eng['busy_s']:.1f} s, {eng['steps']:.0f} steps × {rows:.1f} rows, "
            f"graph capture {eng['capture_s']:.1f} s, admission {eng['admit_s']:.1f} s")


def figures(res: dict, trajectories: int, cuda: bool) -> list[tuple[str, float, float | None]]:
    """(figure, value, reference bound) rows; the bound is None where there is none."""
    from searchr1.engines.local.training import flops

    card = flops.card() if cuda else flops.CARDS["H200"]
    hbm, peak_flops = card.hbm_bytes_per_s, card.bf16_flops
    m, split, n = res["last"]["metrics"], res["last"]["split"], res["n_matmul"]
    rows = min(res["kv_slots"] or 1, trajectories)
    decode_bound = rows * hbm / (2 * n)
    tokens = m.get("train/tokens_per_rollout_batch", 0.0)
    out = [(f"time/{k}_s", split[k], None) for k in SPLIT]
    out.append(("time/step_s", m["time/step_seconds"], None))
    sampled_per_s = m["rollout/sampled_tokens"] / max(split["rollout"], 1e-9)
    out.append(("rollout/sampled_tokens_per_s", sampled_per_s, decode_bound))
    length = m.get("rollout/trajectory_tokens", 0.0)
    context, live = decode_shape(res["last"])
    kv_bound = rows * hbm / (2 * n + rows * context * res["kv_bytes_per_token"])
    out.append(("rollout/mean_decode_context", context, float(length)))
    out.append(("rollout/sampled_tokens_per_s (KV-read bound)", sampled_per_s, kv_bound))
    eng = res["last"].get("engine") or {}
    if eng.get("steps"):
        out.append(("rollout/engine_busy_s (of the rollout)", eng["busy_s"], split["rollout"]))
        out.append(("rollout/mean_rows_per_engine_step (of the pool)", live, float(rows)))
        out.append(("rollout/sampled_tokens_per_busy_s (KV-read bound at those rows)",
                    m["rollout/sampled_tokens"] / max(eng["busy_s"], 1e-9),
                    live * hbm / (2 * n + live * context * res["kv_bytes_per_token"])))
    alone = res.get("standalone")
    if alone:
        kv = res["kv_bytes_per_token"]
        at_live, pool = alone["live"], alone["pool"]
        out.append(("rollout/standalone_rows (live rows, of the pool)", float(at_live["rows"]), float(pool["rows"])))
        out.append(("rollout/sampled_tokens_per_s (of standalone, live rows, cached)",
                    sampled_per_s, at_live["cached_tokens_per_s"]))
        out.append(("rollout/standalone_tokens_per_s, live rows (cold, of cached)",
                    at_live["cold_tokens_per_s"], at_live["cached_tokens_per_s"]))
        for label, at in (("live rows", at_live), ("the pool", pool)):
            bound_at = at["rows"] * hbm / (2 * n + at["rows"] * at["context"] * kv)
            out.append((f"rollout/standalone_tokens_per_s, {label} (KV-read bound)", at["cached_tokens_per_s"], bound_at))
        scale = PAPER_TRAJECTORIES / trajectories
        rest = m["time/step_seconds"] - split["rollout"]
        paper = rest * scale + m["rollout/sampled_tokens"] * scale / max(pool["cached_tokens_per_s"], 1e-9)
        out.append(("time/step_s at 512 × 5, EXTRAPOLATED (of the 8-min target)", paper, PAPER_TARGET_S))
    out.append(("train/update_tokens_per_s", tokens / max(split["update"], 1e-9), peak_flops / (6 * n)))
    scored = res["last"].get("split_tokens") or dict.fromkeys(SPLIT, tokens)
    for name in ("old_logprobs", "reference"):  # the tokens each pass was given; none: no pass
        out.append((f"train/{name}_tokens_per_s", scored[name] / split[name] if split[name] > 0 else 0.0,
                    peak_flops / (2 * n)))
    out.append(("train/update_mfu", 6 * n * tokens / max(split["update"], 1e-9) / peak_flops, 1.0))
    lim = res["limits"]
    out.append(("rollout/observation_tokens", res["last"]["observation_tokens"],
                float(lim.max_observation_tokens)))
    out.append(("rollout/turns", m.get("rollout/turns", 0.0), float(lim.max_searches + 1)))
    out.append(("rollout/search_calls", m.get("rollout/search_calls", 0.0), float(lim.max_searches)))
    out.append(("rollout/action_tokens", m.get("rollout/action_tokens", 0.0),
                float((lim.max_searches + 1) * lim.max_turn_tokens)))
    peak = res["last"]["peak_bytes"]
    if cuda and peak is not None:
        out.append(("memory/peak_gib", peak / 2**30, torch.cuda.get_device_properties(0).total_memory / 2**30))
    return out


def print_table(rows) -> None:
    print(f"\n{'figure':<46} {'value':>14} {'bound':>14} {'ratio':>8}")
    for name, value, bound in rows:
        b = f"{bound:14.4g}" if bound is not None else f"{'-':>14}"
        r = f"{value / bound:8.3f}" if bound else f"{'':>8}"
        print(f"{name:<46} {value:14.4g} {b} {r}")


def main(argv: list[str] | None = None) -> dict:
    from searchr1.engines.local.shapes import SHAPES, saved_tokenizer, write_shape

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2_5_3b", choices=sorted(SHAPES))
    ap.add_argument("--tuning", default="full", choices=["full", "lora"])
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--questions", type=int, default=512)
    ap.add_argument("--group", type=int, default=5)
    ap.add_argument("--layers", type=int, default=None, help="override the shape's depth")
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--tokenizer", default=None,
                    help="a saved tokenizer folder (default: the embedded SmolLM2's, which needs its GGUF)")
    ap.add_argument("--profile", action="store_true", help="print the last step's component profile")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="profile the slot sampler's first N admission rounds of the last step by kernel")
    ap.add_argument("--standalone", action="store_true",
                    help="then time the sampler alone at the step's live rows and context, and at the whole pool")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="the GIL's switch interval during the steps (Python's default: 5 ms; gil_contention.py)")
    ap.add_argument("--engines", nargs="+", default=None, choices=["slots", "vllm", "hf", "auto"],
                    help="run the step once per engine.sampler, each in its own process, and compare")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.engines and len(args.engines) > 1:
        return compare_engines(args)
    if args.engines:
        args.overrides = [*args.overrides, f"engine.sampler={args.engines[0]}"]
    # progress on stdout (phases, memory plan, steps): a call that runs out of time still says how far it got
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s: %(message)s")
    if args.device != "cpu" and not torch.cuda.is_available():
        print("paper_scale: no CUDA device; use --device cpu (with --shape tiny) for the smoke check",
              file=sys.stderr)
        raise SystemExit(2)
    root = Path(tempfile.mkdtemp(prefix="paper_scale-"))
    tokenizer = saved_tokenizer(args.tokenizer) if args.tokenizer else None
    clock = time.perf_counter()
    model_dir = write_shape(args.shape, root / "model", args.layers, tokenizer=tokenizer,
                            device="cpu" if args.device == "cpu" else "cuda")
    if args.device != "cpu":
        torch.cuda.empty_cache()
    print(f"paper_scale: model written in {time.perf_counter() - clock:.1f} s", flush=True)
    cfg = compose(overrides(args, model_dir, root / "run"))
    timers = kernels = None
    if args.profile or args.kernels:
        sys.path.insert(0, str(HERE))
        import profile_step
    if args.profile:
        timers = profile_step.Timers()
        profile_step.install(timers)
    if args.kernels:
        from searchr1.engines.local.sampling.slot_engine import SlotEngine

        kernels = profile_step.KernelProfile(args.kernels)
        SlotEngine._admit = kernels.wrap(SlotEngine._admit)
    previous = sys.getswitchinterval()  # --switch-interval-ms: the GIL's, for this step only
    try:
        if args.switch_interval_ms:
            sys.setswitchinterval(args.switch_interval_ms / 1000)
        switch_ms = sys.getswitchinterval() * 1000
        res = asyncio.run(run_steps(cfg, root / "run", timers, args.standalone, kernels))
    finally:
        sys.setswitchinterval(previous)
    rows = figures(res, args.questions * args.group, args.device != "cpu")
    print(f"\npaper-scale step: {args.shape} ({args.tuning}), {args.questions} × {args.group} trajectories, "
          f"N = {res['n_matmul'] / 1e9:.3f} B matmul weights, {res['kv_slots']} KV slots "
          f"(step 1 = {res['first_step_seconds']:.1f} s)")
    print_table(rows)
    profile = None
    if timers is not None:
        profile = profile_step.per_step(timers)[-1]
        wall = res["last"]["metrics"]["time/step_seconds"]
        print(f"\nprofile of the last step ({wall:.1f} s; host time, two threads):")
        for label in profile_step.COMPONENTS:
            print(f"  {label:40s} {profile.get(label, 0.0):8.3f} s {profile.get(label, 0.0) / wall:7.1%}")
    if kernels is not None:
        print(f"\nadmission rounds of the last step by kernel (profiled: their time above includes the profiler): "
              f"{kernels.table()}")
    print(f"sampler: {res['sampler_stats']}")
    result = dict(shape=args.shape, tuning=args.tuning, steps=args.steps, questions=args.questions,
                  group=args.group, n_matmul=res["n_matmul"], kv_slots=res["kv_slots"],
                  table={name: dict(value=v, bound=b, ratio=(v / b if b else None)) for name, v, b in rows},
                  split_tokens=res["last"]["split_tokens"], metrics=res["last"]["metrics"], overrides=args.overrides,
                  **provenance(),
                  profile=profile, sampler_stats=res["sampler_stats"], standalone=res["standalone"],
                  per_step=res["per_step"], switch_interval_ms=switch_ms,
                  kernels=dict(calls=kernels.done, wall_s=kernels.wall, totals=kernels.totals) if kernels else None)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=float))
    return result


def compare_engines(args) -> dict:
    """The step once per engine (a process each, one after the other), then both columns."""
    import subprocess

    results = {}
    for engine in args.engines:
        out = Path(tempfile.mkdtemp(prefix=f"paper_scale-{engine}-")) / "r.json"
        cmd = [sys.executable, __file__, "--shape", args.shape, "--tuning", args.tuning, "--steps", str(args.steps),
               "--questions", str(args.questions), "--group", str(args.group), "--device", args.device,
               "--engines", engine, "--out", str(out)]
        cmd += [*(["--layers", str(args.layers)] if args.layers else []),
                *(["--tokenizer", args.tokenizer] if args.tokenizer else []), *(["--profile"] if args.profile else []),
                *(["--kernels", str(args.kernels)] if args.kernels else []),
                *(["--standalone"] if args.standalone else []),
                *(["--switch-interval-ms", str(args.switch_interval_ms)] if args.switch_interval_ms else [])]
        code = subprocess.run([*cmd, "--", *args.overrides]).returncode
        results[engine] = json.loads(out.read_text()) if out.exists() else {"error": f"exit {code}"}
    ref, names = args.engines[0], [e for e in args.engines if "table" in results[e]]
    print(f"\npaper-scale step by engine: {args.shape} ({args.tuning}), {args.questions} × {args.group}, "
          f"{args.steps} step(s), last step; ratio = engine / {ref}")
    figures_ = list(dict.fromkeys(f for e in names for f in results[e]["table"]))
    print(f"{'figure':<60} " + " ".join(f"{e:>12}" for e in names) + f" {'bound':>12}  ratios")
    for figure in figures_:
        cells = [results[e]["table"].get(figure, {}) for e in names]
        values = [c.get("value") for c in cells]
        bound = next((c.get("bound") for c in cells if c.get("bound")), None)
        base = results[ref]["table"].get(figure, {}).get("value") if ref in names else None
        ratios = " ".join(f"{v / base:.2f}" if (v is not None and base) else "-" for v in values)
        print(f"{figure:<60} " + " ".join(f"{v:12.4g}" if v is not None else f"{'-':>12}" for v in values)
              + (f" {bound:12.4g}" if bound else f" {'-':>12}") + f"  {ratios}")
    for e in args.engines:
        if "error" in results[e]:
            print(f"{e}: {results[e]['error']}")
    combined = {"engines": results, **provenance()}
    if args.out:
        Path(args.out).write_text(json.dumps(combined, indent=1, default=float))
    return combined


if __name__ == "__main__":
    main()
