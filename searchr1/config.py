"""The config schema: one dataclass per group option, stored in Hydra's ConfigStore.

Each YAML option under ``conf/<group>/`` starts with ``defaults: [<option>_schema, _self_]``,
so its values are merged onto a typed schema: a misspelt key or a wrong type fails at
compose time with Hydra's own message. The schema of an option lives beside its code
(``BM25Config`` in ``searchr1/retrievers/bm25.py`` …); this module only collects them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from searchr1.data.jsonl import LabJsonlConfig
from searchr1.data.nq_hotpotqa import NqHotpotqaConfig
from searchr1.data.world import WorldConfig
from searchr1.engines.local.config import LocalEngineConfig, ModelConfig
from searchr1.engines.trio import TrioEngineConfig
from searchr1.losses.config import LossConfig
from searchr1.protocols.tags import TagsConfig
from searchr1.protocols.tool_call import ToolCallConfig
from searchr1.retrievers.bm25 import BM25Config
from searchr1.retrievers.cache import with_cache_fields
from searchr1.retrievers.e5 import E5Config
from searchr1.retrievers.http import HttpConfig
from searchr1.retrievers.zhihu import ZhihuConfig
from searchr1.rewards import RewardConfig
from searchr1.schemas import (
    AdvantageConfig,
    CriticConfig,
    EvalConfig,
    LoggerConfig,
    Mode,
    RolloutConfig,
    SwanlabConfig,
    TrainerConfig,
    WandbConfig,
)
from searchr1.warmstart.config import WarmStartConfig


@dataclass
class Config:
    """The root config (``conf/config.yaml``)."""

    mode: Mode = Mode.train  # train | eval
    seed: int = 0  # seeds data order, sampling and LoRA init
    engine: Any = MISSING  # local | trio
    model: ModelConfig = MISSING
    data: Any = MISSING  # world | lab_jsonl | nq_hotpotqa
    retriever: Any = MISSING  # bm25 | zhihu | http | e5
    protocol: Any = MISSING  # tags | tool_call
    reward: RewardConfig = MISSING
    advantage: AdvantageConfig = MISSING
    critic: CriticConfig = field(default_factory=CriticConfig)  # advantage=ppo_gae only
    loss: LossConfig = MISSING
    rollout: RolloutConfig = MISSING
    trainer: TrainerConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    swanlab: SwanlabConfig = field(default_factory=SwanlabConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)  # none | oracle_sft | embedded


#: (group, option name, schema) for every option that has a YAML file under conf/
SCHEMAS: list[tuple[str, str, type]] = [
    ("engine", "local", LocalEngineConfig),
    ("engine", "trio", TrioEngineConfig),
    ("model", "model", ModelConfig),
    ("data", "world", WorldConfig),
    ("data", "lab_jsonl", LabJsonlConfig),
    ("data", "nq_hotpotqa", NqHotpotqaConfig),
    ("retriever", "bm25", BM25Config),
    ("retriever", "zhihu", ZhihuConfig),
    ("retriever", "e5", E5Config),
    ("retriever", "http", HttpConfig),
    ("protocol", "tags", TagsConfig),
    ("protocol", "tool_call", ToolCallConfig),
    ("reward", "reward", RewardConfig),
    ("advantage", "advantage", AdvantageConfig),
    ("loss", "loss", LossConfig),
    ("rollout", "rollout", RolloutConfig),
    ("trainer", "trainer", TrainerConfig),
    ("warmstart", "warmstart", WarmStartConfig),
]


def register_configs() -> None:
    """Store the root schema and every option schema (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, name, schema in SCHEMAS:
        if group == "retriever":  # every retriever gets `cache` / `cache_path`
            schema = with_cache_fields(schema)
        cs.store(group=group, name=f"{name}_schema", node=schema)
