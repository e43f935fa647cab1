"""rollout_schedule — wall time of ``rollout.schedule`` async vs lockstep on a latency model.

The REAL rollout engine (``searchr1/rollout/engine.py`` and ``lockstep.py``) drives a fake
sampler and a fake retriever that sleep (``asyncio.sleep``) for the time a seeded latency
model gives, multiplied by ``--time-scale`` so a run takes seconds; figures are reported in
model seconds (wall ÷ scale). The protocol is the char-level test protocol
(``tests/rollout_fakes.CharProtocol``): only timing is measured, not text.

Latency model (all seeded by ``--seed``; the same for every schedule):
- a trajectory plans k searches (k = 0..4 with weights ``--k-weights``) and then answers, so
  it has k + 1 turns; each turn generates L tokens, L uniform in [16, max_turn_tokens];
- sampling a request takes ``0.5 + 1.5 · L / max_turn_tokens`` s (0.5–2 s by length); the
  first turn of a group is one request with ``num_samples=group_size`` and takes the time
  of its longest sample;
- a search takes ``0.3 · exp(N(0, σ))`` s (median 0.3 s, σ = ``--search-sigma``, a
  lognormal long tail); a batched call of several queries takes its slowest query's time;
- no concurrency limits (the engine's semaphores are opened to the trajectory count): the
  model is pure latency, as with a sampler and a search service that scale out.

Reference: the critical-path bound = the longest single trajectory's own sampling + search
latencies (what any schedule needs with infinite parallelism). Also printed: the modelled
wall of each schedule (async: the bound; lockstep: Σ over turns of the turn's slowest
sample + its slowest search (batched) or all its searches one after another (serial)), as a
check that the measured schedule is the one the model describes.

    uv run python experiments/benchmarks/rollout_schedule.py [--repeats 5] [--out rows.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from searchr1.data.types import QAExample  # noqa: E402
from searchr1.retrievers.base import Document, Retriever  # noqa: E402
from searchr1.rollout.engine import RolloutEngine, SamplingSettings  # noqa: E402
from searchr1.rollout.lockstep import LockstepSearch, RolloutSchedule  # noqa: E402
from searchr1.schemas import RolloutConfig  # noqa: E402
from tests.helpers.rollout_fakes import CharProtocol, dec, enc  # noqa: E402

SCHEDULES = {  # name → RolloutConfig fields
    "async": {"schedule": RolloutSchedule["async"]},
    "lockstep+batched": {"schedule": RolloutSchedule["lockstep"],
                         "lockstep_search": LockstepSearch.batched},
    "lockstep+serial": {"schedule": RolloutSchedule["lockstep"],
                        "lockstep_search": LockstepSearch.serial},
}
TID = re.compile(r"^S:(t[\w.]+)/")  # a trajectory's id, written at the start of each query


@dataclass(frozen=True)
class LatencyModel:
    """Seeded, pure functions of a trajectory id and a turn: plans, lengths, latencies."""

    seed: int
    max_turn_tokens: int
    k_weights: tuple[float, ...]
    search_sigma: float

    def _rng(self, *key: object) -> random.Random:
        return random.Random(":".join(map(str, (self.seed, *key))))

    def searches(self, tid: str) -> int:
        """How many searches trajectory ``tid`` makes before it answers."""
        return self._rng("k", tid).choices(range(len(self.k_weights)), self.k_weights)[0]

    def length(self, tid: str, turn: int) -> int:
        return self._rng("len", tid, turn).randint(16, self.max_turn_tokens)

    def sample_s(self, tid: str, turn: int) -> float:
        return 0.5 + 1.5 * self.length(tid, turn) / self.max_turn_tokens

    def search_s(self, tid: str, turn: int) -> float:
        return 0.3 * math.exp(self._rng("search", tid, turn).gauss(0.0, self.search_sigma))


def tid_of(question: str, index: int) -> str:
    return f"t{question}.{index}"


class ModelSampler:
    """Replies per the plan and sleeps the modelled sampling time × ``scale``.

    Turn n of trajectory ``tid`` searches ``tid/n`` (padded to its modelled length) while
    n < k, then answers. The trajectory id is read back from the first turn in the prompt.
    """

    def __init__(self, model: LatencyModel, scale: float) -> None:
        self.model, self.scale = model, scale

    async def sample_async(self, prompt, num_samples=1, sampling_params=None):
        text = dec(prompt.to_ints())
        turn = text.count(";")
        question = text[2:text.index("|")]
        first = TID.search(text[text.index("|") + 1:])
        tids = [first.group(1)] if first else [tid_of(question, i) for i in range(num_samples)]
        await asyncio.sleep(max(self.model.sample_s(t, turn) for t in tids) * self.scale)
        return SampleResponse(sequences=[self._reply(t, turn) for t in tids])

    def _reply(self, tid: str, turn: int) -> SampleSequence:
        head = f"S:{tid}/{turn}" if turn < self.model.searches(tid) else "A:x"
        reply = head + "_" * (self.model.length(tid, turn) - len(head) - 1) + ";"  # L tokens
        toks = enc(reply)
        return SampleSequence(stop_reason="stop", tokens=toks, text=reply,
                              logprobs=[0.0] * len(toks))


class ModelRetriever(Retriever):
    """Sleeps the slowest query's modelled search time × ``scale``; one document per query."""

    def __init__(self, model: LatencyModel, scale: float) -> None:
        super().__init__()
        self.model, self.scale = model, scale
        self.calls = 0

    async def _search(self, queries, topk):
        self.calls += 1
        keys = [q.rstrip("_").split("/") for q in queries]
        await asyncio.sleep(max(self.model.search_s(t, int(n)) for t, n in keys) * self.scale)
        return [[Document(id="d", title="", text="")] for _ in queries]


@dataclass
class Run:
    """One timed rollout of the whole batch under one schedule."""

    wall_s: float  # model seconds (measured wall ÷ scale)
    search_calls: int
    turns: int
    ends: dict[str, int] = field(default_factory=dict)


def run_once(model: LatencyModel, schedule: dict, examples: list[QAExample], group: int,
             scale: float) -> Run:
    n = len(examples) * group
    cfg = RolloutConfig(max_searches=len(model.k_weights), max_turns=len(model.k_weights) + 1,
                        max_turn_tokens=model.max_turn_tokens, max_trajectory_tokens=1 << 16,
                        sampler_concurrency=n, search_concurrency=n, **schedule)
    retriever = ModelRetriever(model, scale)
    engine = RolloutEngine(CharProtocol(), retriever, topk=1, cfg=cfg)
    sampler = ModelSampler(model, scale)

    async def go():
        start = time.perf_counter()
        groups = await engine.rollout(sampler, examples, group, SamplingSettings(1.0))
        return time.perf_counter() - start, groups

    wall, groups = asyncio.run(go())
    trajs = [t for g in groups for t in g]
    for t in trajs:  # the rollout followed the plan (else the bound below is not its bound)
        assert len(t.turns) == model.searches(tid_of(t.example.question, t.group_index)) + 1
    ends: dict[str, int] = {}
    for t in trajs:
        ends[t.end_reason.value] = ends.get(t.end_reason.value, 0) + 1
    return Run(wall / scale, retriever.calls, sum(len(t.turns) for t in trajs), ends)


def modelled(model: LatencyModel, examples: list[QAExample], group: int) -> dict[str, float]:
    """The critical-path bound and each schedule's modelled wall (model seconds)."""
    tids = {ex.question: [tid_of(ex.question, i) for i in range(group)] for ex in examples}
    first = {q: max(model.sample_s(t, 0) for t in ts) for q, ts in tids.items()}  # group request

    def samp(q: str, tid: str, turn: int) -> float:
        return first[q] if turn == 0 else model.sample_s(tid, turn)

    all_ = [(q, t) for q, ts in tids.items() for t in ts]
    bound = max(sum(samp(q, t, n) for n in range(model.searches(t) + 1))
                + sum(model.search_s(t, n) for n in range(model.searches(t))) for q, t in all_)
    batched = serial = 0.0
    for n in range(max(model.searches(t) for _, t in all_) + 1):
        turn_samp = max(samp(q, t, n) for q, t in all_ if model.searches(t) >= n)
        searches = [model.search_s(t, n) for _, t in all_ if model.searches(t) > n]
        batched += turn_samp + max(searches, default=0.0)
        serial += turn_samp + sum(searches)
    return {"bound": bound, "async": bound, "lockstep+batched": batched,
            "lockstep+serial": serial}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--time-scale", type=float, default=0.1, help="wall s per model s")
    ap.add_argument("--max-turn-tokens", type=int, default=128)
    ap.add_argument("--k-weights", type=float, nargs="+", default=[0.1, 0.3, 0.35, 0.2, 0.05],
                    help="weights of 0, 1, 2, … searches per trajectory")
    ap.add_argument("--search-sigma", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    model = LatencyModel(args.seed, args.max_turn_tokens, tuple(args.k_weights), args.search_sigma)
    examples = [QAExample(id=f"q{k}", question=f"w{k}", golden_answers=("x",), data_source="m")
                for k in range(args.questions)]
    ref = modelled(model, examples, args.group_size)
    rows = []
    print(f"{args.questions} questions × {args.group_size}, {args.repeats} repeats, "
          f"time scale {args.time_scale}; model seconds")
    print(f"{'schedule':<18}{'wall (median)':>14}{'modelled':>10}{'bound':>8}{'wall/bound':>12}"
          f"{'search calls':>14}")
    for name, schedule in SCHEDULES.items():
        runs = [run_once(model, schedule, examples, args.group_size, args.time_scale)
                for _ in range(args.repeats)]
        wall = statistics.median(r.wall_s for r in runs)
        row = {"schedule": name, "wall_s_median": wall, "wall_s": [r.wall_s for r in runs],
               "modelled_s": ref[name], "bound_s": ref["bound"], "ratio": wall / ref["bound"],
               "search_calls": runs[0].search_calls, "turns": runs[0].turns,
               "end_reasons": runs[0].ends}
        rows.append(row)
        print(f"{name:<18}{wall:>14.2f}{ref[name]:>10.2f}{ref['bound']:>8.2f}"
              f"{row['ratio']:>12.2f}{row['search_calls']:>14}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(),
            "args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
