"""Where an RL step's time goes: an instrumented profile of the real entry point.

Runs ``python -m searchr1.main`` in this process for ``--steps`` steps (the RL-step benchmark's
setting: ``experiment=paper_grpo_world``, 16 questions × 8 trajectories) with timing wrappers
around the functions that make up a step — the slot sampler's admission, prefill, decode
windows, host syncs (stop-string checks included) and weight folds; search; reward scoring;
packing; the scoring passes; forward/backward; the optimizer — and prints, per component, the
median seconds per step over the steps after the first (graph capture and compile are in the
first), its share of the step's wall time, and the step's own split (``time/*``).

    python experiments/benchmarks/profile_step.py --steps 6 -- warmstart=embedded

Components run on two threads (the sampler's worker and the main loop), so shares can add up to
more than 100%; "unaccounted" is the main thread's wall time outside every wrapped call of the
main thread (Python between stages, awaiting the sampler, event-loop overhead). Times are
exclusive (a wrapped call inside another is not counted twice). A wrapper measures host time: CUDA work launched inside it and finished later is charged to whichever
wrapped call waits for it (the sampler's host sync, a ``.item()`` or ``.cpu()``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import runpy
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# label -> (module, attribute path, thread): what each row of the table times
COMPONENTS = {
    "sampler: admit + prefix copy": ("searchr1.engines.local.sampling.slot_engine", "SlotEngine._admit", "sampler"),
    "sampler: prefill": ("searchr1.engines.local.sampling.slot_engine", "SlotEngine._prefill", "sampler"),
    "sampler: decode windows (launch)": ("searchr1.engines.local.sampling.slot_engine", "SlotEngine._decode_window", "sampler"),
    "sampler: host sync + stop strings": ("searchr1.engines.local.sampling.slot_engine", "SlotEngine._sync", "sampler"),
    "sampler: weight fold": ("searchr1.engines.local.sampling.slot_engine", "SlotEngine._fold", "sampler"),
    "search (BM25)": ("searchr1.retrievers.base", "LocalRetriever.search_sync", "search"),
    "reward scoring": ("searchr1.rollout.scoring", "score_trajectory", "main"),
    "packing (FFD bins)": ("searchr1.batch.microbatches", "pack_ffd", "main"),
    "packing (sequences)": ("searchr1.engines.local.training.packing", "pack_samples", "main"),
    "scoring passes (old/ref log-probs)": ("searchr1.engines.local.training.forward_backward", "Passes.reference", "main"),
    "forward (no grad)": ("searchr1.engines.local.training.client", "LocalTrainingClient.forward", "main"),
    "forward/backward": ("searchr1.engines.local.training.client", "LocalTrainingClient.forward_backward", "main"),
    "forward/backward (custom loss)": ("searchr1.engines.local.training.client", "LocalTrainingClient.forward_backward_custom", "main"),
    "optimizer step": ("searchr1.engines.local.training.client", "LocalTrainingClient.optim_step", "main"),
    "sampler log-probs (compute_logprobs)": ("searchr1.engines.local.sampling.sampling_client", "LocalSamplingClient.compute_logprobs", "main"),
}


class Timers:
    """Seconds per label, and a snapshot after every finished step."""

    def __init__(self) -> None:
        self.total: dict[str, float] = collections.defaultdict(float)
        self.depth = threading.local()
        self.snapshots: list[dict[str, float]] = []
        self.main_wrapped = 0.0

    def wrap(self, label: str, thread: str, fn):
        """``fn`` timed exclusively: a wrapped call inside another is charged to itself only."""
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            stack = self.depth.__dict__.setdefault("stack", [])
            stack.append(0.0)  # time spent in wrapped children of this call
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                children = stack.pop()
                self.total[label] += dt - children
                if stack:
                    stack[-1] += dt
                elif thread == "main" and threading.current_thread() is threading.main_thread():
                    self.main_wrapped += dt
        return timed

    def snapshot(self) -> None:
        self.snapshots.append({**self.total, "__main_wrapped": self.main_wrapped,
                               "__clock": time.perf_counter()})


class KernelProfile:
    """Time by kernel over a few calls of one method (``torch.profiler``), summed over the calls.

    ``wrap`` returns the method profiled: while ``armed`` and for the first ``calls`` calls after
    that, each call runs under the profiler, synchronized before and after (so its device work is
    inside), and its events are summed by name (``totals``: self device seconds where there is
    a GPU, else self CPU seconds, and a count). ``wall`` is the calls' synchronized wall time.
    """

    def __init__(self, calls: int) -> None:
        self.calls, self.armed, self.done, self.wall = calls, False, 0, 0.0
        self.totals: dict[str, list] = {}  # name -> [seconds, count]

    def wrap(self, fn):
        @functools.wraps(fn)
        def profiled(*args, **kwargs):
            if not self.armed or self.done >= self.calls:
                return fn(*args, **kwargs)
            import torch
            from torch.profiler import ProfilerActivity, profile

            cuda = torch.cuda.is_available()
            sync = torch.cuda.synchronize if cuda else (lambda: None)
            sync()
            with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                sync()
                self.wall += time.perf_counter() - t0
            self.done += 1
            self.add(prof.key_averages(), device=cuda)
            return out
        return profiled

    def reset(self) -> None:
        """Forget the calls profiled so far (disarmed): the next armed calls start a new table."""
        self.armed, self.done, self.wall, self.totals = False, 0, 0.0, {}

    def add(self, events, device: bool) -> None:
        """Sum ``key_averages()`` rows: self device time (kernels) or self CPU time (ops), in seconds."""
        for e in events:
            us = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)) \
                if device else e.self_cpu_time_total
            if us > 0:
                entry = self.totals.setdefault(e.key, [0.0, 0])
                entry[0] += us / 1e6
                entry[1] += e.count

    def table(self, top: int = 15) -> str:
        """The ``top`` names by time, per call and as a share of the calls' wall time."""
        per = max(1, self.done)
        lines = [f"{self.done} calls, {self.wall / per * 1e3:.1f} ms each (synchronized wall)",
                 f"  {'ms/call':>9} {'share':>7} {'count/call':>10}  name"]
        for name, (sec, count) in sorted(self.totals.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"  {sec / per * 1e3:9.2f} {sec / max(self.wall, 1e-12):7.1%} {count / per:10.1f}  {name[:90]}")
        return "\n".join(lines)


# imported before wrapping, so that names bound by ``from x import f`` are rebound too
USERS = ("searchr1.loop.train_step", "searchr1.loop.update", "searchr1.loop.trainer",
         "searchr1.loop.evaluate", "searchr1.batch.step_batch", "searchr1.engines.local.service")


def install(timers: Timers) -> list[str]:
    """Wrap every component that exists in this tree; returns the labels left out."""
    for name in USERS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    missing = []
    for label, (module, path, thread) in COMPONENTS.items():
        try:
            owner = importlib.import_module(module)
            *parents, name = path.split(".")
            for p in parents:
                owner = getattr(owner, p)
            original = getattr(owner, name)
            timed = timers.wrap(label, thread, original)
            setattr(owner, name, timed)
            if not parents:  # a module-level function: rebind it wherever it was imported
                for mod in list(sys.modules.values()):
                    if getattr(mod, "__name__", "").startswith("searchr1.") and \
                            getattr(mod, name, None) is original:
                        setattr(mod, name, timed)
        except (ImportError, AttributeError):
            missing.append(label)
    trainer = importlib.import_module("searchr1.loop.trainer")
    original = trainer.crash_point

    def after_step(name, step=None):
        if name == "after_update":
            timers.snapshot()
        return original(name, step)

    trainer.crash_point = after_step
    return missing


def per_step(timers: Timers) -> list[dict[str, float]]:
    """Seconds per label in each step after the first."""
    snaps = timers.snapshots
    return [{k: snaps[i][k] - snaps[i - 1].get(k, 0.0) for k in snaps[i]} for i in range(1, len(snaps))]


def table(steps: list[dict[str, float]], rows: list[dict]) -> str:
    wall = statistics.median(r["time/step_seconds"] for r in rows[1:]) if len(rows) > 1 else float("nan")
    lines = [f"{'component':40s} {'s/step':>8s} {'share of step':>14s}"]
    for label in COMPONENTS:
        values = [s.get(label, 0.0) for s in steps]
        med = statistics.median(values) if values else 0.0
        lines.append(f"{label:40s} {med:8.3f} {med / wall:14.1%}")
    un = statistics.median(s["__clock"] - s["__main_wrapped"] for s in steps) if steps else 0.0
    lines.append(f"{'unaccounted (main thread)':40s} {un:8.3f} {un / wall:14.1%}")
    lines.append(f"{'step wall time (time/step_seconds)':40s} {wall:8.3f} {1:14.1%}")
    for key in ("time/rollout", "time/train"):
        vals = [r[key] for r in rows[1:] if key in r]
        if vals:
            lines.append(f"{key:40s} {statistics.median(vals):8.3f} {statistics.median(vals) / wall:14.1%}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--out", default=None, help="write the per-step profile as JSON here")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    timers = Timers()
    missing = install(timers)
    run_dir = Path(tempfile.mkdtemp(prefix="profile-step-"))
    sys.argv = ["searchr1.main", "experiment=paper_grpo_world", f"trainer.steps={args.steps}",
                f"trainer.questions_per_step={args.questions}", f"rollout.group_size={args.group}",
                "eval.before_training=false", "eval.max_questions=1", "trainer.save_every=0",
                f"hydra.run.dir={run_dir}", *extra]
    timers.snapshot()  # the clock before step 1 (model load included in step 1's delta)
    try:
        runpy.run_module("searchr1.main", run_name="__main__", alter_sys=True)
    except SystemExit as err:
        if err.code not in (0, None):
            raise
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_seconds" in r]
    steps = per_step(timers)[1:]  # drop step 1 (load, capture, compile)
    print(f"\nprofile of {len(steps)} steps after the first ({args.questions} × {args.group}); "
          f"components not in this tree: {missing or 'none'}")
    print(table(steps, rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": steps, "rows": rows, "missing": missing}, indent=1))


if __name__ == "__main__":
    main()
