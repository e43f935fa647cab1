"""Hydra entry point: ``python -m searchr1.main [group=option ...] [key=value ...]``.

Composes ``conf/config.yaml`` onto the typed schema (``searchr1.config``), checks that the
chosen options fit together and that credentials exist before any work, builds the run's
objects (``searchr1.build``) and runs ``mode=train`` (default) or ``mode=eval``. Artifacts
go to Hydra's run directory: ``metrics.jsonl``, ``summary.json``, checkpoints and eval files.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from searchr1.config import register_configs
from searchr1.evaluate import evaluate_split, write_summary
from searchr1.preflight import preflight
from searchr1.rollout.engine import SamplingSettings
from searchr1.schemas import Mode
from searchr1.secrets import install_secret_filter

log = logging.getLogger("searchr1")
register_configs()


async def _eval_only(cfg: DictConfig, app, run_dir: Path) -> dict[str, float]:
    """``mode=eval``: the base model (or a saved sampler path) on the eval split."""
    sampler = app.service.create_sampling_client(cfg.eval.model_path)
    examples = app.dataset.split(cfg.eval.split)[: cfg.eval.max_questions]
    settings = SamplingSettings(temperature=cfg.eval.temperature, seed=cfg.seed)
    return await evaluate_split(sampler, app.rollout, examples, app.reward_fn, settings, run_dir)


def run(cfg: DictConfig, run_dir: Path, tracker) -> dict[str, float]:
    """Build everything and run the configured mode; returns the final metrics."""
    from searchr1.build import build_app
    from searchr1.trainer import Trainer

    app = build_app(cfg, run_dir)
    if cfg.mode == Mode.eval:
        metrics = asyncio.run(_eval_only(cfg, app, run_dir))
        tracker.log(metrics, 0)
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
    preflight(cfg)
    with open_trackers(cfg, run_dir) as tracker:
        metrics = run(cfg, run_dir, tracker)
        tracker.summary(metrics)
    log.info("run directory: %s", run_dir)


if __name__ == "__main__":
    main()
