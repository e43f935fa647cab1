"""Evaluation: greedy rollouts on a split, ``trajectories.jsonl`` (+ its HTML report),
``summary.json``, a table.

Used by ``mode=eval`` and by the trainer before, during and after training. One trajectory
per question (group size 1), temperature from ``eval.temperature`` (0 = greedy).

On the paper's benchmarks (``data=nq_hotpotqa``) the metrics also hold the paper's Table 2
(``eval/paper_em/*``, ``searchr1/analysis/paper_table.py``), printed beside the lab's macro EM from
the same trajectories.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from searchr1.data.types import QAExample
from searchr1.loop.progress import TurnCounter
from searchr1.analysis.paper_table import format_paper_table, paper_em_metrics
from searchr1.analysis.trajectory_page import write_report
from searchr1.rewards import RewardFn
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.scoring import eval_metrics, score_trajectory
from searchr1.rollout.types import Trajectory


async def run_eval(
    sampler,
    engine: RolloutEngine,
    examples: list[QAExample],
    reward_fn: RewardFn,
    settings: SamplingSettings,
    progress: bool = True,
) -> list[Trajectory]:
    """One scored trajectory per example, in the examples' order; a bar counts questions and
    shows the turns and tokens sampled so far (``loop/progress.py``)."""
    bar = tqdm(total=len(examples), desc="eval", unit="q", disable=not progress, leave=False)
    counter = TurnCounter(bar, sampler=sampler)
    sampler = counter.watch(sampler)
    ticker = asyncio.get_running_loop().create_task(counter.ticking()) if progress else None

    async def one(ex: QAExample) -> Trajectory:
        (traj,) = await engine.rollout_group(sampler, ex, 1, settings)
        score_trajectory(traj, engine.protocol, reward_fn)
        bar.update(1)
        return traj

    try:
        return list(await asyncio.gather(*(one(ex) for ex in examples)))
    finally:
        if ticker is not None:
            ticker.cancel()
        bar.close()


def write_trajectories(trajs: list[Trajectory], path: Path) -> Path:
    """One JSON line per trajectory (see ``Trajectory.to_record``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for t in trajs:
            f.write(json.dumps(t.to_record(), ensure_ascii=False) + "\n")
    return path


def write_summary(metrics: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    return path


def format_table(trajs: list[Trajectory]) -> str:
    """Per-source table (EM, F1, format, searches, no-search, turns, search errors) + macro row."""
    rows = []
    for t in trajs:
        searches = [x for x in t.turns if x.action.kind.value == "search"]
        rows.append(
            {
                "source": t.example.data_source,
                "EM": t.scores.get("em", 0.0),
                "F1": t.scores.get("f1", 0.0),
                "format": t.scores.get("format", 0.0),
                "searches": t.num_searches,
                "no_search": float(t.num_searches == 0),
                "turns": len(t.turns),
                "search_err": sum(x.tool_error is not None for x in searches) / max(len(searches), 1),
            }
        )
    if not rows:
        return "(no questions evaluated)"
    df = pd.DataFrame(rows)
    table = df.groupby("source").mean(numeric_only=True)
    table.insert(0, "n", df.groupby("source").size())
    m = eval_metrics(trajs)
    macro = {c: table[c].mean() for c in table.columns}
    macro["n"] = len(df)
    table.loc["macro"] = macro
    table.loc["macro", "EM"] = m["eval/em/macro"]
    return table.to_string(float_format=lambda v: f"{v:.3f}")


async def evaluate_split(
    sampler,
    engine: RolloutEngine,
    examples: list[QAExample],
    reward_fn: RewardFn,
    settings: SamplingSettings,
    out_dir: Path,
    progress: bool = True,
    stop=None,
) -> dict[str, float]:
    """Run, score, write ``trajectories.jsonl`` + ``summary.json`` in ``out_dir``; return metrics.

    ``stop`` (the trainer's ``StopSignals``): a stop signal cancels the eval at its next await
    and raises ``Interrupted`` before anything is written (a partial eval is discarded).
    """
    running = run_eval(sampler, engine, examples, reward_fn, settings, progress)
    trajs = await (running if stop is None else stop.cut_short(running))
    return report_eval(trajs, out_dir)


async def evaluate_split_parallel(dp, sampler, engine, examples, reward_fn, settings,
                                  out_dir: Path, stop=None) -> dict[str, float]:
    """``evaluate_split`` with the questions split over ranks (``dp``): each rank runs its
    block, the trajectories are gathered in question order and rank 0 alone writes the
    files; every rank returns the same metrics (or every rank raises ``Interrupted``)."""
    running = run_eval(sampler, engine, dp.split_eval(examples), reward_fn, settings, dp.is_rank0)
    mine = await (running if stop is None else stop.cut_short(running, dp))
    trajs = [t for part in dp.gather(mine) for t in part]
    metrics = report_eval(trajs, out_dir) if dp.is_rank0 else None
    return dp.broadcast(metrics)


def report_eval(trajs: list[Trajectory], out_dir: Path) -> dict[str, float]:
    """Metrics of scored eval trajectories; writes the files and prints the tables."""
    metrics = eval_metrics(trajs)
    metrics.update(paper_em_metrics(trajs))
    write_report(write_trajectories(trajs, out_dir / "trajectories.jsonl"))
    write_summary(metrics, out_dir / "summary.json")
    print(format_table(trajs), flush=True)
    paper = format_paper_table(metrics)
    if paper:
        print(paper, flush=True)
    return metrics
