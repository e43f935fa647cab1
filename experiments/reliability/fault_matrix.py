"""The fault matrix of issue 13: tool faults against what training does with them.

Every row is a real ``python -m searchr1.main`` run of a tiny random model with
``retriever=zhihu`` pointed at a loopback fake Zhihu server (``searchr1/testing/``) that
injects one fault mix; keys are canaries in ``$ZHIHU_SEARCH_KEYS``. Inside each run a spy
records every rollout group and every datum handed to ``forward_backward``; afterwards
each trained datum is mapped back to its trajectory and each of that trajectory's searches
to what the server served. So "trajectories with a failed search" and "trained datums from
failed searches" come from the server's log, not from the client's own metrics
(``rollout/tool_error_trajectories`` is printed beside it as a cross-check).

    uv run python experiments/reliability/fault_matrix.py [--out DIR] [--parallel 2]

Rows run ``--parallel`` at a time (each is CPU-bound; 2 suits a 2-core machine). The table
goes to stdout as Markdown, and with the raw numbers to ``DIR/fault_matrix.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.fake_zhihu import HTTP_429, HTTP_500, QUOTA, FakeZhihu, FaultPlan
from tests.helpers.fault_run import (
    SEARCHES_PER_STEP, FaultRun, build_tiny_model, canary_hits, main_overrides, run_mains,
)

SHORT = {"timeout": "timeout", "http_429": "429", "http_500": "500", "malformed": "bad JSON",
         "empty": "empty", "quota": "30002", "refused": "refused"}


@dataclass(frozen=True)
class Row:
    """One run of the matrix: a fault mix and the ``rollout.on_tool_error`` policy."""

    name: str
    plan: FaultPlan
    policy: str
    mixed: bool  # mixed search/answer turns, 4 steps of 4 × 3 (else one search per trajectory)


MIXED_20 = FaultPlan(rate=0.2, seed=0)
ROWS = [
    Row("20% mixed faults", MIXED_20, "drop_group", True),
    Row("20% mixed faults", MIXED_20, "drop_trajectory", True),
    Row("20% mixed faults", MIXED_20, "observe", True),
    Row("100% HTTP 500", FaultPlan(rate=1.0, kinds=(HTTP_500,)), "drop_group", False),
    Row("100% HTTP 500", FaultPlan(rate=1.0, kinds=(HTTP_500,)), "observe", False),
    Row("100% HTTP 429", FaultPlan(rate=1.0, kinds=(HTTP_429,)), "drop_group", False),
    Row("100% Code 30002", FaultPlan(rate=1.0, kinds=(QUOTA,)), "drop_group", False),
    Row(f"quota out after {SEARCHES_PER_STEP + 2} answers",
        FaultPlan(quota_after=SEARCHES_PER_STEP + 2), "drop_group", False),
]


def run_row(i: int, row: Row, model_dir: Path, out: Path) -> dict:
    """Run one row; its numbers for the table."""
    run_dir, logs = out / f"row_{i}", out / f"logs_{i}"
    with FakeZhihu(row.plan) as server:
        size = dict(steps=4, questions=4, group=3, max_turns=3, max_searches=2) if row.mixed else {}
        overrides = [f"hydra.run.dir={run_dir}", *main_overrides(model_dir, server.url, **size),
                     f"rollout.on_tool_error={row.policy}"]
        [proc] = run_mains([overrides], logs, mixed=row.mixed, spy_runs=True)
    run = FaultRun.load(logs / "main_0.spy.json")
    metrics = run_dir / "metrics.jsonl"
    run.rows = [(r.get("step", 0), r) for r in map(json.loads, metrics.read_text().splitlines())]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "fault mix": row.name, "policy": row.policy,
        "faults served": server.faults_served(), "answered": server.served.get("ok", 0),
        "trajectories": len(run.trajectories),
        "with a failed search": len(run.failed_by_server(server)),
        "tool_error_trajectories": run.total("rollout/tool_error_trajectories"),
        "trained datums": len(run.trained),
        "trained from failed": run.trained_from_failed(server),
        "steps": len(run.train_rows()), "exit": proc.returncode,
        "stopped": summary.get("stopped_reason", "").split(":")[0],
        "resume hint": "trainer.resume=auto" in proc.stderr,
        "canary hits": len(canary_hits(run_dir, [proc.stdout, proc.stderr])),
    }


def table(results: list[dict]) -> str:
    """The Markdown table of the README."""
    head = ["fault mix", "on_tool_error", "faults served (requests)", "trajectories",
            "with a failed search", "tool_error_trajectories (metric)", "trained datums",
            "trained from failed searches", "steps done", "exit code", "stopped by"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        faults = ", ".join(f"{SHORT.get(k, k)} {n}" for k, n in r["faults served"].items()) or "—"
        cells = [r["fault mix"], r["policy"], faults, r["trajectories"], r["with a failed search"],
                 f"{r['tool_error_trajectories']:g}", r["trained datums"], r["trained from failed"],
                 r["steps"], r["exit"], r["stopped"] or "—"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where runs go (default: a temp dir)")
    parser.add_argument("--parallel", type=int, default=2, help="rows run at once")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fault_matrix_"))
    out.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(out / "tiny_model")
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda ir: run_row(*ir, model_dir, out), enumerate(ROWS)))
    (out / "fault_matrix.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    hints = sum(r["resume hint"] for r in results if r["exit"])
    print(f"\nruns stopped with a resume hint: {hints} of {sum(bool(r['exit']) for r in results)}; "
          f"canary key hits in run files and output: {sum(r['canary hits'] for r in results)}; "
          f"runs in {out}")


if __name__ == "__main__":
    main()
