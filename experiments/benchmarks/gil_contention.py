"""How much a busy Python thread slows a thread that dispatches many small torch ops.

The slot sampler's admission round is ≈ 1,500 eager ops dispatched from its worker thread; in the
paper-size step it takes ≈ 200–230 ms of host time against 48 ms when the same rounds are timed
at the start of a step (``experiments/benchmarks/README.md``, "Admission behind the window"). The
candidate cause is the GIL: the rollout's main thread (search, tokenization, the next turn's
prompts) holds it in bursts at turn boundaries, and under CPython's GIL a thread that wants it back
waits up to the switch interval (``sys.setswitchinterval``, 5 ms by default) each time.

This reproduces the mechanism on the CPU, without a GPU: a worker thread dispatches ``--ops``
in-place adds on a 16-element tensor (dispatch cost, like a kernel launch) while the main thread
runs pure-Python work (``--load python``) or the rollout's BM25 searches over the world
(``--load bm25``), at each switch interval asked for; the reference is the same ops with
the main thread idle, in the same run. Medians of ``--repeats``.

    python experiments/benchmarks/gil_contention.py
    python experiments/benchmarks/gil_contention.py --load bm25 --intervals-ms 5 0.5 0.1 --out r.json

On the GPU the same question is asked of the step itself with
``paper_scale.py --switch-interval-ms X`` against the default.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import threading
import time

import torch

from searchr1.utils.provenance import provenance


def dispatch(ops: int, x: torch.Tensor) -> float:
    """Seconds to dispatch ``ops`` tiny in-place ops."""
    start = time.perf_counter()
    for _ in range(ops):
        x.add_(1)
    return time.perf_counter() - start


def python_work() -> None:
    sum(i * i for i in range(2000))


def bm25_work():
    """One search call of the world's questions against its corpus (the rollout's BM25), 8 at a time."""
    from searchr1.data.world import WorldConfig, generate_world
    from searchr1.retrievers.bm25 import BM25Retriever

    world = generate_world(WorldConfig())
    retriever = BM25Retriever(world.corpus)
    questions = [q.question for q in world.train][:64]
    calls = itertools.count()

    def search() -> None:
        i = next(calls) * 8 % len(questions)
        retriever.search_sync(questions[i : i + 8], 3)

    return search


def timed(ops: int, repeats: int, work=None) -> list[float]:
    """``repeats`` dispatch timings, each in a worker thread (as the sampler's), while this (main)
    thread waits idle, or runs ``work`` in a loop until the worker is done."""
    x, times = torch.zeros(16), []
    for _ in range(repeats):
        worker = threading.Thread(target=lambda: times.append(dispatch(ops, x)))
        worker.start()
        while work is not None and worker.is_alive():
            work()
        worker.join()
    return times


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=1500, help="ops a round dispatches (an admission round's eager ops)")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--intervals-ms", type=float, nargs="+", default=[5.0, 1.0, 0.5, 0.1])
    ap.add_argument("--load", default="python", choices=["python", "bm25"],
                    help="the main thread's work: pure Python, or BM25 searches of the world (8 questions a call)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = bm25_work() if args.load == "bm25" else python_work
    default = sys.getswitchinterval()
    rows = []
    try:
        for interval in args.intervals_ms:
            sys.setswitchinterval(interval / 1000)
            timed(args.ops, 3)  # warm-up
            alone = statistics.median(timed(args.ops, args.repeats))
            busy = statistics.median(timed(args.ops, args.repeats, work))
            rows.append({"interval_ms": interval, "alone_ms": alone * 1e3, "busy_main_ms": busy * 1e3,
                         "ratio": busy / alone})
    finally:
        sys.setswitchinterval(default)
    print(f"{args.ops} tiny torch ops dispatched from a worker thread, main thread idle (reference) or "
          f"running {args.load} work; medians of {args.repeats}; {provenance()['card']}")
    print(f"{'switch interval ms':>18} {'idle main ms':>13} {'busy main ms':>13} {'ratio':>7}")
    for r in rows:
        print(f"{r['interval_ms']:>18g} {r['alone_ms']:>13.1f} {r['busy_main_ms']:>13.1f} {r['ratio']:>7.2f}")
    result = {"ops": args.ops, "repeats": args.repeats, "load": args.load, "rows": rows, **provenance()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
