"""Config → objects. Each function looks the option up in its registry by ``name``.

Every registered option class exposes ``from_config(cfg, …)`` taking its own schema
dataclass, so there is exactly one place that maps a config node to code, and no special
case per option here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from searchr1.data import DATASETS
from searchr1.data.audit import warn_data_quirks
from searchr1.data.jsonl import JsonlFormatError
from searchr1.data.nq_hotpotqa import DataFileError
from searchr1.data.types import Dataset
from searchr1.engines import ENGINES
from searchr1.engines.base import LoopLimits
from searchr1.loop.plan import total_optimizer_steps, trajectories_per_step
from searchr1.protocols import PROTOCOLS
from searchr1.protocols.base import Protocol
from searchr1.retrievers import RETRIEVERS
from searchr1.retrievers.base import Retriever
from searchr1.retrievers.cache import with_search_cache
from searchr1.rewards import RewardFn, build_reward
from searchr1.rollout.engine import RolloutEngine
from searchr1.startup.errors import exit_with

if TYPE_CHECKING:
    from searchr1.loop.train_step import StepRunner


def to_schema(node: DictConfig):
    """The typed dataclass instance behind a structured config node."""
    return OmegaConf.to_object(node)


def build_dataset(cfg: DictConfig) -> Dataset:
    return DATASETS.get(cfg.name)(to_schema(cfg))


def build_retriever(cfg: DictConfig, dataset: Dataset) -> Retriever:
    schema = to_schema(cfg)
    return with_search_cache(RETRIEVERS.get(cfg.name).from_config(schema, dataset), schema)


def build_protocol(cfg: DictConfig, tokenizer) -> Protocol:
    return PROTOCOLS.get(cfg.name).from_config(to_schema(cfg), tokenizer)


def loop_limits(trainer, group_size: int = 0) -> LoopLimits:
    """The ``trainer`` numbers an engine sizes itself by (with ``rollout.group_size``, the
    trajectories a rollout samples at once)."""
    return LoopLimits(trainer.max_datums_per_microbatch, trainer.max_padded_tokens_per_microbatch,
                      overlapped_rollout=trainer.max_staleness > 0,
                      rollout_trajectories=trajectories_per_step(trainer, group_size))


def build_engine(cfg: DictConfig, run_dir: Path, dp=None):
    """The engine's service client (PyTRIO ``ServiceClient`` API) for ``cfg.model``: the
    engine gets its own config, the model's, the loop's limits and the job's ``dp``."""
    factory = ENGINES.get(cfg.engine.name)
    return factory(to_schema(cfg.engine), to_schema(cfg.model), run_dir,
                   loop_limits(cfg.trainer, cfg.rollout.group_size), dp=dp)


@dataclass
class App:
    """Everything a run needs, built once from the config."""

    dataset: Dataset
    service: object
    protocol: Protocol
    retriever: Retriever
    reward_fn: RewardFn
    rollout: RolloutEngine


def build_app(cfg: DictConfig, run_dir: Path, dp=None) -> App:
    dataset = build_dataset(cfg.data)
    retriever = build_retriever(cfg.retriever, dataset)
    service = build_engine(cfg, run_dir, dp)
    tokenizer = service.get_tokenizer()
    protocol = build_protocol(cfg.protocol, tokenizer)
    warn_data_quirks(dataset, tokenizer, cfg.rollout)  # duplicate ids, over-long questions
    reward_fn = build_reward(to_schema(cfg.reward))
    rollout = RolloutEngine(protocol, retriever, cfg.retriever.topk, to_schema(cfg.rollout))
    return App(dataset, service, protocol, retriever, reward_fn, rollout)


def build_step_runner(cfg: DictConfig, rollout: RolloutEngine, reward_fn: RewardFn, service,
                      dp=None) -> StepRunner:
    """The step pipeline with its config slices, the KL reference and (an estimator that
    ``needs_critic``) the critic. The trainer calls it (``Trainer.build_runner``) once its
    training client exists: the reference sampler is the base model as that client sees it."""
    # lazy: torch, which the retrieval server (it builds its retriever here) never loads
    from searchr1.distributed.context import SINGLE  # lazy: torch (see above)
    from searchr1.loop.train_step import StepRunner, StepSettings  # lazy: torch (see above)
    from searchr1.loop.update import UpdateSettings  # lazy: torch (see above)

    loss, trainer = to_schema(cfg.loss), to_schema(cfg.trainer)
    settings = StepSettings(to_schema(cfg.rollout), to_schema(cfg.advantage),
                            UpdateSettings.from_configs(loss, trainer),
                            trainer.max_datum_tokens, cfg.seed)
    reference = service.create_sampling_client() if loss.kl.coef > 0 else None
    critic = None
    if settings.estimator.needs_critic:
        from searchr1.engines.local.training.critic import build_critic  # lazy: torch, peft

        total = total_optimizer_steps(trainer, cfg.rollout.group_size)
        critic = build_critic(to_schema(cfg.critic), to_schema(cfg.model), cfg.engine.cache_dir, total, cfg.seed, dp)
        critic.warmup = (trainer.warmup_unit, trainer.warmup_start, trainer.steps)
    return StepRunner(settings, rollout, reward_fn, reference, critic, dp or SINGLE)


def build_app_or_exit(cfg: DictConfig, run_dir: Path, dp=None):
    """``build_app``, turning a malformed or missing data file (found while loading, before
    the model) into the same one-paragraph exit as every other start-up problem."""
    try:
        return build_app(cfg, run_dir, dp)
    except (JsonlFormatError, DataFileError) as err:
        exit_with(f"searchr1: cannot start this run:\n  - {err}")
