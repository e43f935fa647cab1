"""Hydra entry point: ``python -m searchr1.main [group=option ...] [key=value ...]``.

Composes ``conf/config.yaml`` onto the typed schema (``searchr1.config``), checks that the
chosen options fit together and that credentials exist before any work, builds the run's
objects (``searchr1.build``) and runs ``mode=train`` (default) or ``mode=eval``. Artifacts
go to Hydra's run directory: ``metrics.jsonl``, ``summary.json``, checkpoints and eval files.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from searchr1.config import register_configs
from searchr1.data.selection import eval_examples
from searchr1.evaluate import evaluate_split, write_summary
from searchr1.preflight import preflight
from searchr1.rollout.engine import SamplingSettings
from searchr1.schemas import Mode
from searchr1.rundir import RunDirLock, refuse_live_run_dir
from searchr1.secrets import install_record_scrubber, install_secret_filter

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
    from searchr1.validate import build_app_or_exit
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


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from searchr1.tracking import open_trackers

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    install_secret_filter()  # after Hydra configured logging: scrub keys from every record
    preflight(cfg, run_dir)
    with RunDirLock(run_dir), open_trackers(cfg, run_dir) as tracker:
        metrics = run(cfg, run_dir, tracker)
        tracker.summary(metrics)
    log.info("run directory: %s", run_dir)


if __name__ == "__main__":
    refuse_live_run_dir(sys.argv[1:])  # before Hydra rewrites a live run's .hydra/
    main()
