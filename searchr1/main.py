"""Hydra entry point: ``python -m searchr1.main [group=option ...] [key=value ...]``.

Composes ``conf/config.yaml`` onto the typed schema (``searchr1.config``), checks that the
chosen options fit together and that credentials exist before any work, builds the run's
objects (``searchr1.build``) and runs ``mode=train`` (default) or ``mode=eval``. Artifacts
go to Hydra's run directory: ``metrics.jsonl``, ``summary.json``, checkpoints and eval files.
"""

from __future__ import annotations

if __name__ == "__main__":  # first, before the imports: glibc reads its tunables at start only
    from searchr1.utils.host_memory import reexec_with_huge_pages

    reexec_with_huge_pages()
    from searchr1.startup.override_guard import guard_command_line

    guard_command_line()  # a credential on the command line: exit 2 before Hydra echoes it

import asyncio
import contextlib
import logging
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from searchr1.build import build_app_or_exit, build_step_runner
from searchr1.config import register_configs
from searchr1.distributed.context import SINGLE, RankLost
from searchr1.distributed.launch import (join, multirun_problem, rank_argv, shutdown,
                                         under_torchrun, world_from_env)
from searchr1.distributed.rank0 import rank0_only, rank0_trackers
from searchr1.startup.errors import StartupError, exit_with
from searchr1.loop.eval_mode import run_eval_mode
from searchr1.loop.evaluate import write_summary
from searchr1.loop.breaker import SearchOutage
from searchr1.loop.checkpoint import CheckpointWriteError, resolve_resume
from searchr1.loop.stop import Stopped, StopSignals
from searchr1.loop.trainer import Trainer
from searchr1.startup.preflight import preflight
from searchr1.config import Mode
from searchr1.startup.refused import removed_if_refused
from searchr1.startup.resume_args import resume_argv
from searchr1.startup.rundir import RunDirLock, refuse_live_run_dir
from searchr1.utils import host_memory
from searchr1.utils.hydra_scrub import install_record_scrubber
from searchr1.utils.secrets import install_secret_filter
from searchr1.warmstart.apply import run_sft_mode

log = logging.getLogger("searchr1")
register_configs()
install_record_scrubber()  # Hydra logs overrides before our handlers exist


def run(cfg: DictConfig, run_dir: Path, tracker, dp=None, stop=None) -> dict[str, float]:
    """Build everything and run the configured mode; returns the final metrics. ``stop``: the
    job's ``StopSignals`` (train mode), so a signal during start-up stops at the first boundary."""
    if cfg.mode == Mode.train:  # a resume with no complete checkpoint, or one of another
        resolve_resume(cfg.trainer.resume, run_dir, dp.world if dp else 1)  # N: exit 2 first
    app = build_app_or_exit(cfg, run_dir, dp)  # a bad data file: one paragraph, exit 2
    if cfg.mode == Mode.eval:  # the warm start applied as in training (loop/eval_mode.py)
        metrics = asyncio.run(run_eval_mode(cfg, app, run_dir, tracker))
        tracker.log(metrics, 0)
    elif cfg.mode == Mode.sft:  # the supervised warm start alone (searchr1/warmstart/)
        metrics = asyncio.run(run_sft_mode(cfg, app, run_dir, tracker))
    else:
        trainer = Trainer(cfg, run_dir, app.service, app.dataset, app.rollout, app.reward_fn, tracker, dp,
                          stop, build_runner=build_step_runner)
        metrics = asyncio.run(trainer.run())
    if dp is None or dp.is_rank0:
        write_summary(metrics, run_dir / "summary.json")
    return metrics


def resume_command(run_dir: Path, overrides: list[str]) -> str:
    """The command line that continues this run (the job's overrides, resume=auto, its dir)."""
    keep = [o for o in overrides
            if o.partition("=")[0].lstrip("+~") not in ("trainer.resume", "hydra.run.dir")]
    args = ["trainer.resume=auto", f"hydra.run.dir={run_dir}", *keep]
    return "uv run python -m searchr1.main " + " ".join(shlex.quote(a) for a in args)  # as the README


STOPS = (SearchOutage, Stopped, CheckpointWriteError)  # a run that stops by design: one paragraph
EXIT_CODES = {kind: kind.exit_code for kind in STOPS}  # also what tests/helpers/dist_run.py exits with
ADVICE = {  # what to do before resuming, by how the run stopped
    SearchOutage: "Once search works again (check the retriever, its keys and quota), continue with",
    Stopped: "Continue it with",
    CheckpointWriteError: "Free disk space (or point hydra.run.dir at a larger disk after moving the "
                          "run dir there), then continue with",
}


@dataclass(frozen=True)
class StopPoint:
    """Where a stopped run stands: its last step on disk and what is kept of it."""

    step: int  # steps completed and checkpointed
    reason: str
    saved: str  # what a resume finds, one sentence
    summary: dict[str, float]  # the run so far (``summary.json``; empty after a failed write)


def stop_point(err: SearchOutage | Stopped | CheckpointWriteError) -> StopPoint:
    """A checkpoint that failed to write leaves the step before it; the other stops were
    checkpointed at their step."""
    if isinstance(err, CheckpointWriteError):
        return StopPoint(err.step - 1, err.reason, "nothing of that step was kept; the newest "
                         "complete checkpoint is unchanged and a resume redoes the step", {})
    saved = (f"the run is checkpointed at step {err.step}" if err.step else
             "no step was completed, so nothing was checkpointed and a resume starts over")
    return StopPoint(err.step, err.reason, saved, err.summary)


def record_stop(point: StopPoint, run_dir: Path) -> str:
    """``summary.json`` with ``stopped_reason`` (best effort); the clause saying so, or ""."""
    try:
        write_summary({**point.summary, "stopped_reason": point.reason}, run_dir / "summary.json")
    except OSError:
        return ""
    return f" and {run_dir / 'summary.json'} records the reason"


def report_stop(err: Exception, run_dir: Path, overrides: list[str]) -> str:
    """Record the stop in the run dir and say on stderr, in one paragraph, how to go on."""
    point = stop_point(err)
    where = record_stop(point, run_dir)
    when = f"after step {point.step}" if point.step else "before the first step"
    text = (f"searchr1: stopped {when}: {point.reason}. {point.saved[0].upper()}{point.saved[1:]}"
            f"{where}. {ADVICE[type(err)]}: {resume_command(run_dir, overrides)}")
    print(text, file=sys.stderr, flush=True)
    return text


def exit_stopped(err: Exception, dp, run_dir: Path) -> None:
    """A run that stopped by design: rank 0 reports it; the process exits with the stop's code,
    except a search outage in a multirun, re-raised so Hydra marks this job failed and goes on
    with the next."""
    hydra_cfg = HydraConfig.get()
    if dp.is_rank0:
        report_stop(err, run_dir, list(hydra_cfg.overrides.task))
    if hydra_cfg.mode == RunMode.MULTIRUN and isinstance(err, SearchOutage):
        raise err
    shutdown()  # every rank stopped at one boundary: leave the process group cleanly
    sys.exit(EXIT_CODES[type(err)])


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    with removed_if_refused(Path(HydraConfig.get().runtime.output_dir)):  # exit 2 leaves no empty dir
        _main(cfg)


def _main(cfg: DictConfig) -> None:
    host_memory.configure()  # before the model and the worker threads: freed memory goes back
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    install_secret_filter()  # after Hydra configured logging: scrub keys from every record
    if under_torchrun():  # one data-parallel replica per process (searchr1/distributed/)
        dp, run_dir = join(cfg, run_dir)
    else:
        dp = SINGLE
    if dp.is_rank0:
        preflight(cfg, run_dir)
    stop = StopSignals() if cfg.mode == Mode.train else None  # a sweep's job too, from its start
    try:
        with stop or contextlib.nullcontext(), rank0_only(dp, RunDirLock(run_dir)), \
                rank0_trackers(dp, cfg, run_dir) as tracker:
            metrics = run(cfg, run_dir, tracker, dp, stop)
            tracker.summary(metrics)
    except STOPS as err:  # breaker, signal, disk
        exit_stopped(err, dp, run_dir)
    except RankLost as err:  # a peer died or hung: one paragraph naming it, exit 1
        print(err.message, file=sys.stderr, flush=True)
        raise
    shutdown()
    log.info("run directory: %s", run_dir)


if __name__ == "__main__":
    from searchr1.startup.checks import refuse_unwritable_output_dir
    from searchr1.startup.config_errors import run_main
    from searchr1.startup.launcher import launcher_problem

    if multirun_problem(sys.argv[1:]):
        exit_with(multirun_problem(sys.argv[1:]))
    if launcher_problem(sys.argv[1:]):  # SLURM asked for where there is none: before the sweep dir
        exit_with(launcher_problem(sys.argv[1:]))
    if world_from_env()[0] == 0:
        refuse_live_run_dir(sys.argv[1:])  # before Hydra rewrites a live run's .hydra/
        refuse_unwritable_output_dir(sys.argv[1:])  # before Hydra tries to create it
    sys.argv[1:] = resume_argv(sys.argv[1:])  # a resume re-composes the run's own overrides
    sys.argv[1:] = rank_argv(sys.argv[1:])
    try:
        run_main(main)  # a config Hydra cannot compose: its message, then exit 2 (not 1)
    except StartupError as err:  # raised after Hydra started (a model or memory check)
        err.report()
        raise
