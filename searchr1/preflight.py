"""Checks made before any work: option combinations and credentials.

Everything missing is collected and reported in one message, so a user with neither a
PyTRIO login nor Zhihu keys learns both at once, before a model is loaded.
"""

from __future__ import annotations

from omegaconf import DictConfig


class PreflightError(SystemExit):
    """Raised (as a clean exit with a message, not a traceback) when a run cannot start."""


def problems(cfg: DictConfig) -> list[str]:
    """Human-readable reasons this config cannot run; empty when it can."""
    out: list[str] = []
    if cfg.advantage.name == "ppo_gae":
        out.append("advantage=ppo_gae needs a critic, which is not implemented yet "
                   "(use advantage=grpo_std or advantage=group_mean)")
    if cfg.loss.kl.placement not in ("reward", "loss"):
        out.append(f"loss.kl.placement must be 'reward' or 'loss', got {cfg.loss.kl.placement!r}")
    if cfg.rollout.group_size < 1:
        out.append("rollout.group_size must be >= 1")
    out += _credential_problems(cfg)
    return out


def _credential_problems(cfg: DictConfig) -> list[str]:
    """Ask each remote option whether its credentials are present (no network)."""
    out: list[str] = []
    if cfg.retriever.name == "zhihu":
        from searchr1.retrievers.zhihu import ZhihuRetriever

        out += ZhihuRetriever.check_credentials(cfg.retriever)
    if cfg.engine.name == "trio":
        from searchr1.engines.trio import check_credentials

        out += check_credentials(cfg.engine)
    return out


def preflight(cfg: DictConfig) -> None:
    found = problems(cfg)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        raise PreflightError(f"searchr1: cannot start this run:\n{lines}")
