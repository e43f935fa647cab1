"""Hydra entry point: ``python -m searchr1.main [group=option ...] [key=value ...]``.

Composes ``conf/config.yaml`` onto the typed schema (``searchr1.config``), checks that the
chosen options fit together and that credentials exist before any work, builds the run's
objects (``searchr1.build``) and runs ``mode=train`` (default) or ``mode=eval``. Artifacts
go to Hydra's run directory: ``metrics.jsonl``, ``summary.json``, checkpoints and eval files.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from searchr1.config import register_configs
from searchr1.data.selection import eval_examples
from searchr1.loop.evaluate import evaluate_split, write_summary
from searchr1.loop.breaker import EXIT_SEARCH_OUTAGE, SearchOutage
from searchr1.startup.preflight import preflight
from searchr1.rollout.engine import SamplingSettings
from searchr1.schemas import Mode
from searchr1.startup.rundir import RunDirLock, refuse_live_run_dir
from searchr1.utils.secrets import install_record_scrubber, install_secret_filter

log = logging.getLogger("searchr1")
register_configs()
install_record_scrubber()  # Hydra logs overrides before our handlers exist


async def _eval_only(cfg: DictConfig, app, run_dir: Path) -> dict[str, float]:
    """``mode=eval``: the base model (or a saved sampler path) on the eval split."""
    sampler = app.service.create_sampling_client(cfg.eval.model_path)
    examples = eval_examples(app.dataset, cfg.eval)
    settings = SamplingSettings(temperature=cfg.eval.temperature, seed=cfg.seed)
    return await evaluate_split(sampler, app.rollout, examples, app.reward_fn, settings, run_dir)


def run(cfg: DictConfig, run_dir: Path, tracker) -> dict[str, float]:
    """Build everything and run the configured mode; returns the final metrics."""
    from searchr1.startup.checks import build_app_or_exit
    from searchr1.loop.trainer import Trainer

    app = build_app_or_exit(cfg, run_dir)  # a bad data file: one paragraph, exit 2
    if cfg.mode == Mode.eval:
        metrics = asyncio.run(_eval_only(cfg, app, run_dir))
        tracker.log(metrics, 0)
    elif cfg.mode == Mode.sft:  # the supervised warm start alone (searchr1/warmstart/)
        from searchr1.warmstart.apply import run_sft_mode

        metrics = asyncio.run(run_sft_mode(cfg, app, run_dir, tracker))
    else:
        trainer = Trainer(cfg, run_dir, app.service, app.dataset, app.rollout, app.reward_fn, tracker)
        metrics = asyncio.run(trainer.run())
    write_summary(metrics, run_dir / "summary.json")
    return metrics


def resume_command(run_dir: Path, overrides: list[str]) -> str:
    """The command line that continues this run (the job's overrides, resume=auto, its dir)."""
    keep = [o for o in overrides
            if o.partition("=")[0].lstrip("+~") not in ("trainer.resume", "hydra.run.dir")]
    args = ["trainer.resume=auto", f"hydra.run.dir={run_dir}", *keep]
    return "python -m searchr1.main " + " ".join(shlex.quote(a) for a in args)


def report_outage(err: SearchOutage, run_dir: Path, overrides: list[str]) -> str:
    """``summary.json`` with ``stopped_reason``, and one paragraph on stderr; returns it."""
    write_summary({**err.summary, "stopped_reason": err.reason}, run_dir / "summary.json")
    text = (f"searchr1: stopped after step {err.step}: {err.reason}. The run is checkpointed "
            f"at step {err.step} and {run_dir / 'summary.json'} records the reason. Once search "
            f"works again (check the retriever, its keys and quota), continue with: "
            f"{resume_command(run_dir, overrides)}")
    print(text, file=sys.stderr, flush=True)
    return text


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.types import RunMode

    from searchr1.trackers.session import open_trackers

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    install_secret_filter()  # after Hydra configured logging: scrub keys from every record
    preflight(cfg, run_dir)
    try:
        with RunDirLock(run_dir), open_trackers(cfg, run_dir) as tracker:
            metrics = run(cfg, run_dir, tracker)
            tracker.summary(metrics)
    except SearchOutage as err:  # the circuit breaker (searchr1/loop/breaker.py)
        report_outage(err, run_dir, list(hydra_cfg.overrides.task))
        if hydra_cfg.mode == RunMode.MULTIRUN:
            raise  # an Exception: Hydra marks this job failed and goes on with the next
        sys.exit(EXIT_SEARCH_OUTAGE)
    log.info("run directory: %s", run_dir)


if __name__ == "__main__":
    refuse_live_run_dir(sys.argv[1:])  # before Hydra rewrites a live run's .hydra/
    main()
