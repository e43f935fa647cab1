"""Start-up validation: every user mistake in one paragraph, exit code 2, before any work.

``check_config`` reads the composed config (no model, no data loading, no network) and
collects every problem it finds — each schema's own (numbers out of range, unknown option
names: declared beside the fields, ``utils/schema.py``), options that do not fit together,
data files that are missing, empty or not JSON, an unwritable run or cache dir, a resume path
that does not exist, a finished run dir, and credentials written into the config — so a user
fixes them all in one go. Hydra's schema already rejects unknown keys, wrong types and enum
values; this module checks the rest. Fields another option does not have are skipped, so the
checks keep working as schemas grow.

Credentials: a string under a key like ``*api_key*``, ``*secret*`` or ``*token*`` (matched
on key words: ``max_turn_tokens`` is not one) is refused with the environment variable to
use instead, and its value is scrubbed from Hydra's ``.hydra/*.yaml`` (``preflight`` does
that). ``retriever.keys_env`` must be a variable's NAME; anything else is treated as a key
that was pasted by mistake and never echoed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from searchr1.data.types import SPLITS
from searchr1.rewards.answer_rule import ANSWER_RULES
from searchr1.startup.rundir import run_dir_problems
from searchr1.startup.writable import refuse_unwritable_output_dir, writable_problem  # noqa: F401
from searchr1.utils.schema import field_value, schema_problems
from searchr1.utils.secrets import is_credential_key

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
RETRIEVER_FILES = ("corpus_path", "index_path")  # every ``data.*_path`` is checked too
# Where each config subtree's credential belongs instead.
CREDENTIAL_ENV = {
    "engine": "PYTRIO_API_KEY (or run `trio login`)",
    "wandb": "WANDB_API_KEY",
    "swanlab": "SWANLAB_API_KEY",
    "logger": "WANDB_API_KEY / SWANLAB_API_KEY",
    "model": "HF_TOKEN",
    "data": "HF_TOKEN",
}


@dataclass
class Findings:
    """What ``check_config`` found: problems to report and literal values to hide."""

    problems: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)


def _rollout(cfg: DictConfig, out: Findings) -> None:
    scripted, protocol = field_value(cfg.rollout, "scripted_policy"), field_value(cfg.protocol, "name")
    if scripted is not None and protocol != "tags":
        out.problems.append("rollout.scripted_policy writes <search>/<answer> tags: it needs "
                            "protocol=tags")


def _context(cfg: DictConfig, out: Findings) -> None:
    """The sampler's context limit must leave a whole turn to generate after the longest
    prompt it is given (``rollout.max_prompt_tokens``); else turns are cut short silently."""
    limit = field_value(cfg.engine, "max_seq_len")
    prompt, turn = field_value(cfg.rollout, "max_prompt_tokens"), field_value(cfg.rollout, "max_turn_tokens")
    if not all(isinstance(v, int) for v in (limit, prompt, turn)):
        return
    if limit - prompt < turn:
        out.problems.append(
            f"engine.max_seq_len={limit} leaves {limit - prompt} tokens to generate after a "
            f"prompt of rollout.max_prompt_tokens={prompt}, fewer than rollout.max_turn_tokens="
            f"{turn}: set engine.max_seq_len>={prompt + turn} (or lower max_prompt_tokens)")


def _engine_needs(cfg: DictConfig, out: Findings) -> None:
    """Options that only some engines or data sets can serve."""
    loss = cfg.get("loss")
    if (field_value(cfg.engine, "name") == "trio" and (field_value(loss, "entropy_coef") or 0) > 0
            and field_value(loss, "entropy") == "exact"):
        out.problems.append("loss.entropy=exact needs the full distribution, which only "
                            "engine=local computes: set loss.entropy=sampled with engine=trio")
    _bm25_corpus(cfg, out)


def _bm25_corpus(cfg: DictConfig, out: Findings) -> None:
    """``retriever=bm25`` without ``retriever.corpus_path`` indexes the data set's own corpus,
    which ``nq_hotpotqa`` never has and ``lab_jsonl`` has only with ``data.corpus_path``."""
    if field_value(cfg.retriever, "name") != "bm25" or field_value(cfg.retriever, "corpus_path"):
        return
    name, own = field_value(cfg.data, "name"), "corpus_path" in cfg.data
    if name == "nq_hotpotqa" or (own and not field_value(cfg.data, "corpus_path")):
        also = " (or data.corpus_path=/path/to/corpus.jsonl)" if own else ""
        out.problems.append(f"retriever=bm25 with data={name} needs retriever.corpus_path="
                            f"/path/to/corpus.jsonl{also}: this data set ships no corpus to "
                            f"search (wiki-18.jsonl is Search-R1's)")


def _eval(cfg: DictConfig, out: Findings) -> None:
    split = field_value(cfg.eval, "split")
    if split in SPLITS:
        count = field_value(cfg.data, f"{split}_questions")
        if count is not None and count < 1:
            out.problems.append(f"data.{split}_questions={count}: the eval split "
                                f"(eval.split={split}) would be empty")
    train = field_value(cfg.data, "train_questions")
    if field_value(cfg, "mode") == "train" and (field_value(cfg.trainer, "steps") or 0) > 0 \
            and train is not None and train < 1:
        out.problems.append(f"data.train_questions={train}: training needs questions "
                            f"(or set trainer.steps=0)")
    path = field_value(cfg.eval, "model_path")
    if path and "://" not in str(path) and not Path(str(path)).expanduser().exists():
        out.problems.append(f"eval.model_path={path}: no such file or folder")


def _answer_rule(cfg: DictConfig, out: Findings) -> None:
    """The answer rule must be able to read the chosen protocol's final turn."""
    name, protocol = field_value(cfg.reward, "answer_rule"), field_value(cfg.protocol, "name")
    rule = ANSWER_RULES.get(name) if name in ANSWER_RULES else None
    if rule is not None and rule.protocols and protocol not in rule.protocols:
        out.problems.append(f"reward.answer_rule={name} reads {rule.reads}, which only "
                            f"protocol={' / '.join(rule.protocols)} writes (protocol={protocol})")


def _file_problem(label: str, path: str) -> str | None:
    """Why ``path`` is not a readable, non-empty data file (JSONL: first row an object)."""
    p = Path(path).expanduser()
    if not p.exists():
        return f"{label}={path}: no such file"
    if not p.is_file():
        return f"{label}={path}: is a folder, not a file"
    if p.stat().st_size == 0:
        return f"{label}={path}: the file is empty"
    if p.name.endswith(".jsonl"):
        with p.open(encoding="utf-8-sig", errors="replace") as f:  # a BOM is fine
            first = next((line for line in f if line.strip()), None)
        if first is None:
            return f"{label}={path}: the file has no rows"
        try:
            row = json.loads(first)
        except ValueError:
            return f"{label}={path}: the first row is not JSON (expected one object per line)"
        if not isinstance(row, dict):
            return f"{label}={path}: the first row is not a JSON object"
    return None


def _paths(cfg: DictConfig, out: Findings) -> None:
    for group in ("data", "retriever"):
        node = cfg.get(group)
        for key in list(node.keys()) if isinstance(node, DictConfig) else []:
            value = field_value(node, key)
            checked = str(key).endswith("_path") if group == "data" else key in RETRIEVER_FILES
            if checked and isinstance(value, str):
                problem = _file_problem(f"{group}.{key}", value)
                if problem:
                    out.problems.append(problem)
            elif key in ("train_path", "dev_path") and OmegaConf.is_missing(node, key):
                out.problems.append(f"{group}.{key} is required (data={node.get('name')})")
    data = cfg.data
    if field_value(data, "source") == "local":
        folder = field_value(data, "local_dir")
        for name in ("train.parquet", "test.parquet"):
            problem = _file_problem("data.local_dir", str(Path(folder or ".") / name))
            if problem:
                out.problems.append(problem + f" ({name} is needed with data.source=local)")


def _writable(cfg: DictConfig, run_dir, out: Findings) -> None:
    checks = [("run directory", run_dir)] if run_dir is not None else []
    cache = field_value(cfg.retriever, "cache")
    if cache == "disk":
        checks.append(("retriever.cache_path's folder",
                       Path(str(field_value(cfg.retriever, "cache_path"))).expanduser().parent))
    for label, folder in checks:
        problem = writable_problem(label, folder)
        if problem:
            out.problems.append(problem)


def _walk(node, path: str):
    """``(dotted path, key, value)`` for every entry of a plain nested container."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        sub = f"{path}.{key}" if path else str(key)
        yield sub, str(key), value
        yield from _walk(value, sub)


def _credentials(cfg: DictConfig, out: Findings) -> None:
    plain = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    for path, key, value in _walk(plain, ""):
        if is_credential_key(key) and isinstance(value, str) and value and value != "???":
            group = path.split(".")[0]
            hf = {"hf", "huggingface"} & set(re.split(r"[^a-z]+", key.lower()))
            keys_env = field_value(cfg.retriever, "keys_env")
            keys_env = keys_env if isinstance(keys_env, str) and ENV_NAME.fullmatch(keys_env) else None
            env = ("HF_TOKEN" if hf else CREDENTIAL_ENV.get(group) or keys_env
                   or "the variable the option documents (ZHIHU_SEARCH_KEYS for retriever=zhihu)")
            out.problems.append(f"{path} holds a credential; credentials are read from the "
                                f"environment, never the config: remove it and set {env} "
                                f"instead (the value is not shown and was scrubbed from .hydra/)")
            out.secrets.append(value)
    keys_env = field_value(cfg.retriever, "keys_env")
    if isinstance(keys_env, str) and not ENV_NAME.fullmatch(keys_env):
        out.problems.append("retriever.keys_env must be the NAME of an environment variable "
                            "(like ZHIHU_SEARCH_KEYS), never a key itself; put the keys in that variable "
                            "(the value given is not shown and was scrubbed from .hydra/)")
        out.secrets.append(keys_env)


def check_config(cfg: DictConfig, run_dir: str | os.PathLike | None = None) -> Findings:
    """Every problem of ``cfg`` (and its run dir) that can be seen before any work."""
    out = Findings()
    _credentials(cfg, out)
    out.problems += schema_problems(cfg)
    _rollout(cfg, out)
    _context(cfg, out)
    _engine_needs(cfg, out)
    _eval(cfg, out)
    _answer_rule(cfg, out)
    _paths(cfg, out)
    _writable(cfg, run_dir, out)
    resume = field_value(cfg.trainer, "resume")
    out.problems += run_dir_problems(run_dir, str(resume) if resume is not None else "never")
    return out


def hydra_output_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """Folders holding Hydra's saved config of this job: ``<run_dir>/.hydra`` and, in a
    multirun, the sweep dir (its ``multirun.yaml`` lists every job's overrides)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return [Path(run_dir) / ".hydra"]
    hc = HydraConfig.get()
    dirs = [Path(run_dir) / (hc.output_subdir or ".hydra")]
    if hc.mode == RunMode.MULTIRUN:
        dirs.append(Path(hc.sweep.dir))
    return dirs
