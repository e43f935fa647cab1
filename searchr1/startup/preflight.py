"""Checks made before any work: option combinations and credentials.

Everything missing is collected and reported in one message, so a user with neither a
PyTRIO login nor Zhihu keys learns both at once, before a model is loaded.
"""

from __future__ import annotations

from omegaconf import DictConfig

from searchr1.engines.trio import check_credentials
from searchr1.retrievers.zhihu import ZhihuRetriever
from searchr1.startup.checks import check_config, hydra_output_dirs
from searchr1.startup.errors import exit_with
from searchr1.startup.hub import hub_problems
from searchr1.utils.cpu_threads import parse_setting
from searchr1.utils.hydra_scrub import scrub_hydra_dir
from searchr1.utils.secrets import hide
from searchr1.warmstart.cache import startup_problems


def problems(cfg: DictConfig) -> list[str]:
    """Human-readable reasons this config cannot run; empty when it can."""
    out: list[str] = []
    if cfg.loss.aggregation == "microbatch_token_mean" and cfg.trainer.microbatch_trajectories < 1:
        out.append("loss.aggregation=microbatch_token_mean needs trainer.microbatch_trajectories >= 1")
    out += _credential_problems(cfg)
    out += hub_problems(cfg)  # a hub model without network: before ten retries and a traceback
    if cfg.engine.name == "local":  # engine.threads / interop_threads: auto, torch or N
        for key in ("threads", "interop_threads"):
            try:
                parse_setting(cfg.engine.get(key, "auto"), f"engine.{key}")
            except ValueError as err:
                out.append(str(err))
    out += startup_problems(cfg)
    return out


def _credential_problems(cfg: DictConfig) -> list[str]:
    """Ask each remote option whether its credentials are present (no network)."""
    out: list[str] = []
    if cfg.retriever.name in ("zhihu", "zhihu_lab"):
        out += ZhihuRetriever.check_credentials(cfg.retriever)
    if cfg.engine.name == "trio":
        out += check_credentials(cfg.engine)
    return out


def preflight(cfg: DictConfig, run_dir=None) -> None:
    """Exit (code 2, one paragraph, no traceback) when the run cannot start; scrub any
    credential found in the config out of Hydra's ``.hydra/`` files first."""
    folders = hydra_output_dirs(run_dir) if run_dir else []
    for folder in folders:  # before anything else can fail
        scrub_hydra_dir(folder)
    findings = check_config(cfg, run_dir)
    for folder in folders if findings.secrets else []:
        scrub_hydra_dir(folder, findings.secrets)
    found = findings.problems + problems(cfg)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        exit_with(hide(f"searchr1: cannot start this run:\n{lines}", findings.secrets))
