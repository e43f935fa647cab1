"""``mode=eval``: a greedy eval of the policy a training run would start from, said at start-up.

What is evaluated, in order of precedence:

- ``eval.model_path``: saved sampler weights (a run's ``checkpoints/engine/sampler/step_N``);
- a warm start (``warmstart=embedded``, the default, ``oracle_sft`` or ``warmstart.init_from``):
  applied exactly as a fresh training run applies it (``warmstart/apply.py``), so
  ``mode=eval`` measures the policy RL starts from, the same weights as a training run's
  step-0 eval (``oracle_sft`` takes its cached adapters, or trains them first);
- ``warmstart=none``: the base model.

The base SmolLM2 never writes the protocol's tags, so evaluating it by accident (as ``mode=eval``
once did whatever the warm start said) runs every question to the turn limit.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from searchr1.data.selection import eval_examples
from searchr1.loop.evaluate import evaluate_split
from searchr1.rollout.engine import SamplingSettings
from searchr1.warmstart.apply import EMBEDDED, apply_warm_start, warm_started

log = logging.getLogger(__name__)


def evaluated(cfg: DictConfig) -> str:
    """What ``mode=eval`` evaluates, in words."""
    ws = cfg.get("warmstart")
    if cfg.eval.model_path:
        return f"the sampler weights in {cfg.eval.model_path}"
    if not warm_started(cfg):
        return f"the base model {cfg.model.hf_id} (warmstart=none)"
    if ws.init_from:
        return f"{cfg.model.name} with the adapters in {ws.init_from} (warmstart.init_from)"
    if ws.name == EMBEDDED:
        return (f"{cfg.model.name} with the packaged warm start (warmstart=embedded: "
                f"searchr1/warmstart/assets/{ws.asset}; warmstart=none evaluates the base model)")
    return f"{cfg.model.name} with the {ws.name} warm start (cached, or trained first)"


async def run_eval_mode(cfg: DictConfig, app, run_dir: Path, tracker=None) -> dict[str, float]:
    """Say what is evaluated, bring the weights there, evaluate the eval split."""
    examples = eval_examples(app.dataset, cfg.eval)
    print(f"mode=eval: {evaluated(cfg)}, on {len(examples)} {cfg.eval.split} questions", flush=True)
    if cfg.eval.model_path or not warm_started(cfg):
        sampler = app.service.create_sampling_client(cfg.eval.model_path)
    else:
        client = app.service.create_lora_training_client(rank=cfg.model.lora_rank, seed=cfg.seed)
        await apply_warm_start(cfg, client, app.dataset, app.rollout, tracker, run_dir)
        sampler = client.save_weights_and_get_sampling_client()
    settings = SamplingSettings(temperature=cfg.eval.temperature, seed=cfg.seed)
    return await evaluate_split(sampler, app.rollout, examples, app.reward_fn, settings, run_dir)
