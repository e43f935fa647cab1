"""Start-up validation: every user mistake in one paragraph, exit code 2, before any work.

``check_config`` reads the composed config (no model, no data loading, no network) and
collects every problem it finds — numbers out of range, data files that are missing, empty
or not JSON, an unknown eval split, an unwritable run or cache dir, a resume path that does
not exist, a finished run dir, and credentials written into the config — so a user fixes
them all in one go. Hydra's schema already rejects unknown keys and wrong types; this module
checks values. Fields another option does not have are skipped, so the checks keep working
as schemas grow.

Credentials: a string under a key like ``*api_key*``, ``*secret*`` or ``*token*`` (matched
on key words: ``max_turn_tokens`` is not one) is refused with the environment variable to
use instead, and its value is scrubbed from Hydra's ``.hydra/*.yaml`` (``preflight`` does
that). ``retriever.keys_env`` must be a variable's NAME; anything else is treated as a key
that was pasted by mistake and never echoed.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from searchr1.startup.writable import refuse_unwritable_output_dir, writable_problem  # noqa: F401
from searchr1.utils.secrets import is_credential_key

SPLITS = ("train", "dev", "test")
MIN_TRAJECTORY_TOKENS = 64  # no protocol's prompt plus one turn fits in fewer tokens
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

Rule = tuple[str, Callable[[float], bool], str]


def _ge(lo: float) -> tuple[Callable[[float], bool], str]:
    return (lambda v: v >= lo), f"must be >= {lo}"


def _gt(lo: float) -> tuple[Callable[[float], bool], str]:
    return (lambda v: v > lo), f"must be > {lo}"


def _within(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False):
    def ok(v: float) -> bool:
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    return ok, f"must be in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


RANGES: dict[str, list[tuple[str, tuple]]] = {
    "rollout": [("group_size", _ge(1)), ("max_searches", _ge(0)), ("max_turns", _ge(1)),
                ("max_turn_tokens", _gt(0)), ("max_observation_tokens", _gt(0)), ("temperature", _ge(0)),
                ("top_p", _within(0, 1, lo_open=True)), ("sampler_concurrency", _ge(1)),
                ("search_concurrency", _ge(1))],
    "trainer": [("steps", _ge(0)), ("questions_per_step", _ge(1)), ("learning_rate", _gt(0)),
                ("warmup_ratio", _within(0, 1)), ("beta1", _within(0, 1, hi_open=True)),
                ("beta2", _within(0, 1, hi_open=True)), ("eps", _gt(0)),
                ("weight_decay", _ge(0)), ("grad_clip_norm", _ge(0)),
                ("minibatch_trajectories", _ge(0)),
                ("microbatch_trajectories", _ge(0)), ("max_datum_tokens", _ge(1)),
                ("max_datums_per_microbatch", _ge(1)),
                ("max_padded_tokens_per_microbatch", _ge(1)), ("save_every", _ge(0)),
                ("eval_every", _ge(0))],
    "eval": [("temperature", _ge(0))],
    "retriever": [("topk", _ge(1)), ("max_concurrency", _ge(1)), ("timeout_s", _gt(0)),
                  ("max_retries", _ge(0)), ("backoff_s", _ge(0)), ("max_content_chars", _ge(1))],
    "trainer.breaker": [("window", _ge(1)), ("threshold", _within(0, 1, lo_open=True)),
                        ("grace_steps", _ge(0)), ("backoff_s", _ge(0))],
    "model": [("lora_rank", _ge(1)), ("lora_alpha", _gt(0))],
    "advantage": [("eps", _ge(0))],
    "critic": [("microbatch_trajectories", _ge(1)), ("max_tokens_per_pass", _ge(1)),
               ("cliprange_value", _ge(0)), ("learning_rate", _gt(0))],
    "engine": [("memory_fraction", _within(0, 1, lo_open=True)), ("admit_every", _ge(1)),
               ("sync_every", _ge(1)), ("prefix_cache_tokens", _ge(0))],
    "data": [("train_questions", _ge(0)), ("dev_questions", _ge(0)), ("test_questions", _ge(0)),
             ("dev_per_source", _ge(0)), ("max_train", _ge(1))],
}


@dataclass
class Findings:
    """What ``check_config`` found: problems to report and literal values to hide."""

    problems: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)


def _value(node, key: str):
    """``node.key``, or None when the node lacks it or it is ``???`` (missing)."""
    if not isinstance(node, DictConfig) or key not in node or OmegaConf.is_missing(node, key):
        return None
    return node[key]


def _ranges(cfg: DictConfig, out: Findings) -> None:
    for group, rules in RANGES.items():  # a group may be a dotted path (trainer.breaker)
        node = OmegaConf.select(cfg, group, default=None)
        for key, (ok, what) in rules:
            value = _value(node, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not (math.isfinite(value) and ok(value)):
                    out.problems.append(f"{group}.{key}={value} {what}")


def _rollout(cfg: DictConfig, out: Findings) -> None:
    r = cfg.rollout
    top_k, total, turn = _value(r, "top_k"), _value(r, "max_trajectory_tokens"), _value(r, "max_turn_tokens")
    if isinstance(top_k, int) and top_k != -1 and top_k < 1:
        out.problems.append(f"rollout.top_k={top_k} must be -1 (off) or >= 1")
    if isinstance(total, int) and isinstance(turn, int):
        floor = max(MIN_TRAJECTORY_TOKENS, turn + 1)
        if total < floor:
            out.problems.append(
                f"rollout.max_trajectory_tokens={total} leaves no room for a prompt and a turn "
                f"(needs >= {floor}: max_turn_tokens + a prompt)")
    if _value(r, "scripted_policy") is not None and _value(cfg.protocol, "name") != "tags":
        out.problems.append("rollout.scripted_policy writes <search>/<answer> tags: it needs "
                            "protocol=tags")


def _context(cfg: DictConfig, out: Findings) -> None:
    """The sampler's context limit must leave a whole turn to generate after the longest
    prompt it is given (``rollout.max_prompt_tokens``); else turns are cut short silently."""
    limit, prompt = _value(cfg.engine, "max_seq_len"), _value(cfg.rollout, "max_prompt_tokens")
    turn = _value(cfg.rollout, "max_turn_tokens")
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
    entropy = _value(loss, "entropy")
    if (_value(cfg.engine, "name") == "trio" and (_value(loss, "entropy_coef") or 0) > 0
            and getattr(entropy, "value", entropy) == "exact"):
        out.problems.append("loss.entropy=exact needs the full distribution, which only "
                            "engine=local computes: set loss.entropy=sampled with engine=trio")
    _bm25_corpus(cfg, out)


def _bm25_corpus(cfg: DictConfig, out: Findings) -> None:
    """``retriever=bm25`` without ``retriever.corpus_path`` indexes the data set's own corpus,
    which ``nq_hotpotqa`` never has and ``lab_jsonl`` has only with ``data.corpus_path``."""
    if _value(cfg.retriever, "name") != "bm25" or _value(cfg.retriever, "corpus_path"):
        return
    name, own = _value(cfg.data, "name"), "corpus_path" in cfg.data
    if name == "nq_hotpotqa" or (own and not _value(cfg.data, "corpus_path")):
        also = " (or data.corpus_path=/path/to/corpus.jsonl)" if own else ""
        out.problems.append(f"retriever=bm25 with data={name} needs retriever.corpus_path="
                            f"/path/to/corpus.jsonl{also}: this data set ships no corpus to "
                            f"search (wiki-18.jsonl is Search-R1's)")


def _eval(cfg: DictConfig, out: Findings) -> None:
    e = cfg.eval
    split, n = _value(e, "split"), _value(e, "max_questions")
    if split is not None and split not in SPLITS:
        out.problems.append(f"eval.split={split!r} is unknown (valid: {', '.join(SPLITS)})")
    if n is not None and n < 1:
        out.problems.append(f"eval.max_questions={n} must be null (the whole split) or >= 1")
    if split in SPLITS:
        count = _value(cfg.data, f"{split}_questions")
        if count is not None and count < 1:
            out.problems.append(f"data.{split}_questions={count}: the eval split "
                                f"(eval.split={split}) would be empty")
    train = _value(cfg.data, "train_questions")
    if _value(cfg, "mode") is not None and str(getattr(cfg.mode, "value", cfg.mode)) == "train" \
            and (_value(cfg.trainer, "steps") or 0) > 0 and train is not None and train < 1:
        out.problems.append(f"data.train_questions={train}: training needs questions "
                            f"(or set trainer.steps=0)")
    path = _value(e, "model_path")
    if path and "://" not in str(path) and not Path(str(path)).expanduser().exists():
        out.problems.append(f"eval.model_path={path}: no such file or folder")


CHOICES = {  # closed string choices that are plain str fields (enums fail at compose already)
    ("reward", "answer_rule"): ("last_line", "lab"),
    ("reward", "normalize"): ("ascii", "unicode", "lab"),
    ("eval", "selection"): ("first", "lab", "per_source_seed"),
    ("protocol", "on_invalid"): ("retry", "end"),
    ("protocol", "parse_rule"): ("ours", "lab"),
    ("protocol", "on_observation_overflow"): ("cut", "end"),
    ("trainer", "metric_names"): ("ours", "lab"),
    ("model", "tuning"): ("lora", "full"),
    ("model", "lora_compute"): ("base", "float32"),
    ("engine", "decode_attention"): ("grouped", "flex"),
}


def _choices(cfg: DictConfig, out: Findings) -> None:
    for (group, key), valid in CHOICES.items():
        value = _value(cfg[group], key) if group in cfg else None
        if value is not None and value not in valid:
            out.problems.append(f"{group}.{key}={value!r} is unknown (valid: {', '.join(valid)})")
    if _value(cfg.reward, "answer_rule") == "lab" and cfg.protocol.name != "tool_call":
        out.problems.append("reward.answer_rule=lab reads the lab's `Answer:` line, which only "
                            f"protocol=tool_call writes (protocol={cfg.protocol.name})")
    template = _value(cfg.protocol, "observation_template_file")
    if cfg.protocol.name == "tool_call" and template is not None:
        from searchr1.protocols.observation_text import load_observation_texts
        try:
            load_observation_texts(str(template))
        except (OSError, ValueError) as err:  # a missing file, bad YAML keys or fields
            out.problems.append(str(err))
    from searchr1.advantages import ADVANTAGES
    from searchr1.data.order import DATA_ORDERS

    for group, key, registry in (("advantage", "name", ADVANTAGES), ("trainer", "data_order", DATA_ORDERS)):
        value = _value(cfg[group], key) if group in cfg else None
        if value is not None and value not in registry:
            out.problems.append(f"{group}.{key}={value!r} is unknown (valid: {', '.join(registry.names())})")
    per_source = _value(cfg.eval, "per_source")
    if per_source is not None and per_source < 1:
        out.problems.append(f"eval.per_source={per_source} must be null (all) or >= 1")


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
            value = _value(node, key)
            checked = str(key).endswith("_path") if group == "data" else key in RETRIEVER_FILES
            if checked and isinstance(value, str):
                problem = _file_problem(f"{group}.{key}", value)
                if problem:
                    out.problems.append(problem)
            elif key in ("train_path", "dev_path") and OmegaConf.is_missing(node, key):
                out.problems.append(f"{group}.{key} is required (data={node.get('name')})")
    data = cfg.data
    if _value(data, "source") == "local":
        folder = _value(data, "local_dir")
        for name in ("train.parquet", "test.parquet"):
            problem = _file_problem("data.local_dir", str(Path(folder or ".") / name))
            if problem:
                out.problems.append(problem + f" ({name} is needed with data.source=local)")


def _writable(cfg: DictConfig, run_dir, out: Findings) -> None:
    checks = [("run directory", run_dir)] if run_dir is not None else []
    cache = _value(cfg.retriever, "cache")
    if getattr(cache, "value", cache) == "disk":
        checks.append(("retriever.cache_path's folder",
                       Path(str(_value(cfg.retriever, "cache_path"))).expanduser().parent))
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
            keys_env = _value(cfg.retriever, "keys_env")
            keys_env = keys_env if isinstance(keys_env, str) and ENV_NAME.fullmatch(keys_env) else None
            env = ("HF_TOKEN" if hf else CREDENTIAL_ENV.get(group) or keys_env
                   or "the variable the option documents (ZHIHU_SEARCH_KEYS for retriever=zhihu)")
            out.problems.append(f"{path} holds a credential; credentials are read from the "
                                f"environment, never the config: remove it and set {env} "
                                f"instead (the value is not shown and was scrubbed from .hydra/)")
            out.secrets.append(value)
    keys_env = _value(cfg.retriever, "keys_env")
    if isinstance(keys_env, str) and not ENV_NAME.fullmatch(keys_env):
        out.problems.append("retriever.keys_env must be the NAME of an environment variable "
                            "(like ZHIHU_SEARCH_KEYS), never a key itself; put the keys in that variable "
                            "(the value given is not shown and was scrubbed from .hydra/)")
        out.secrets.append(keys_env)


def check_config(cfg: DictConfig, run_dir: str | os.PathLike | None = None) -> Findings:
    """Every problem of ``cfg`` (and its run dir) that can be seen before any work."""
    from searchr1.startup.rundir import run_dir_problems

    out = Findings()
    _credentials(cfg, out)
    _ranges(cfg, out)
    _rollout(cfg, out)
    _context(cfg, out)
    _engine_needs(cfg, out)
    _eval(cfg, out)
    _choices(cfg, out)
    _paths(cfg, out)
    _writable(cfg, run_dir, out)
    resume = _value(cfg.trainer, "resume")
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
