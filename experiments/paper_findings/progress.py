"""How far a running arm is and how long it has left, from its own run folder.

    python3 experiments/paper_findings/progress.py RUN_DIR      # "step 57 of 100, ≈ 6.4 min left"

``run_study.sh status`` (and so every ``wait`` line) prints it per arm, so a device session can
tell whether its arms finish in the call it is about to make or should be packed with their
resume files (``RESUME=1``). The estimate: the steps left times the median of the last
``RECENT`` steps' ``time/step_seconds`` (an unmasked arm's steps lengthen as it collapses, so
recent steps, not all), plus the evals left times the median logged ``time/eval`` (runs from
before 2026-12-06 have none: evals then count 0). The target step and eval period come from
the run's ``.hydra/config.yaml`` (``trainer.steps``, ``trainer.eval_every``).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

RECENT = 10


@dataclass(frozen=True)
class Progress:
    step: int  # the last step logged (0: none yet)
    steps: int  # the run's trainer.steps
    seconds_left: float | None  # None until a step has been timed

    def line(self) -> str:
        if self.step >= self.steps:
            return f"step {self.step} of {self.steps}"
        left = "time left unknown" if self.seconds_left is None else f"≈ {self.seconds_left / 60:.1f} min left"
        return f"step {self.step} of {self.steps}, {left}"


def trainer_settings(run: Path) -> tuple[int, int]:
    """``(trainer.steps, trainer.eval_every)`` of the run's composed config."""
    import yaml

    cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    trainer = cfg.get("trainer") or {}
    return int(trainer["steps"]), int(trainer.get("eval_every") or 0)


def read_metrics(run: Path) -> list[dict]:
    """Every complete line of ``metrics.jsonl`` (a line being written is skipped)."""
    rows = []
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def estimate(rows: list[dict], steps: int, eval_every: int) -> Progress:
    """The progress of a run that logged ``rows`` towards ``steps``."""
    step = max((int(r["step"]) for r in rows if "step" in r), default=0)
    step_times = [float(r["time/step_seconds"]) for r in rows if "time/step_seconds" in r]
    eval_times = [float(r["time/eval"]) for r in rows if "time/eval" in r]
    if not step_times:
        return Progress(step, steps, None)
    per_step = statistics.median(step_times[-RECENT:])
    per_eval = statistics.median(eval_times) if eval_times else 0.0
    evals_left = sum(1 for s in range(step + 1, steps + 1) if eval_every and s % eval_every == 0)
    return Progress(step, steps, max(steps - step, 0) * per_step + evals_left * per_eval)


def progress(run: Path) -> Progress:
    steps, eval_every = trainer_settings(run)
    return estimate(read_metrics(run), steps, eval_every)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    run = Path(args[0])
    try:
        print(progress(run).line())
    except (OSError, KeyError, ValueError, ImportError) as err:  # no config yet (an arm just started), no yaml
        print(f"step -, progress unknown ({type(err).__name__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
