"""The warm start's entry points: the trainer's hook and ``mode=sft``.

``apply_warm_start`` runs once on a fresh RL run, right after the LoRA training client is
created: it loads ``warmstart.init_from`` or the embedded asset, or runs (or reuses from the
cache) the oracle SFT. On ``engine=local`` the SFT result is always reloaded from its
compact bf16 form, which also resets the optimizer, so a cache hit and a fresh computation
start RL from identical weights. On ``engine=trio`` (``load_state`` only before training)
a freshly trained client is kept as it is, optimizer moments included. ``fix_reference``
then makes the KL reference the warm-started policy.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from searchr1.warmstart import cache
from searchr1.warmstart.oracle import OracleRenderer
from searchr1.warmstart.sft import heldout_nll, run_sft

log = logging.getLogger(__name__)
EMBEDDED = "embedded"


def _adam(cfg: DictConfig) -> dict:
    t = cfg.trainer
    return {"beta1": t.beta1, "beta2": t.beta2, "eps": t.eps,
            "weight_decay": t.weight_decay, "grad_clip_norm": t.grad_clip_norm}


def _load(cfg: DictConfig, client, directory: Path) -> None:
    cache.check_rank(directory, cfg.model.lora_rank, cfg.model.lora_alpha)
    client.load_state(cache.load_path(directory)).result()
    log.info("warm start: loaded adapters from %s", directory)


def warm_started(cfg: DictConfig) -> bool:
    """Whether ``apply_warm_start`` changes the weights of a fresh run."""
    ws = cfg.get("warmstart")
    return ws is not None and bool(ws.init_from or ws.name != "none")


def fix_reference(cfg: DictConfig, client) -> bool:
    """After a warm start, make the KL reference the warm-started policy (the policy RL starts
    from, as the paper's reference is its initial policy); True when the client did. Without
    a warm start, or without KL, there is nothing to do. A client that cannot freeze its
    reference (``engine=trio``: ``capabilities.freeze_reference``) keeps the base model as its
    reference, with a warning."""
    if not warm_started(cfg) or not cfg.loss.kl.coef:
        return False
    if not client.capabilities.freeze_reference:
        log.warning("engine=%s: the KL reference is the base model, not the warm start "
                    "(docs/departures.md)", cfg.engine.name)
        return False
    client.freeze_reference()
    log.info("KL reference: the warm-started policy")
    return True


def asset_dir(cfg: DictConfig) -> Path:
    return cache.ASSETS / cfg.warmstart.asset


async def apply_warm_start(cfg: DictConfig, client, dataset, rollout, tracker,
                           run_dir: Path) -> dict[str, float]:
    """Bring a fresh training client to the configured warm start; returns its metrics."""
    ws = cfg.get("warmstart")
    if ws is None:  # a config composed without the warmstart group
        return {}
    if ws.init_from and str(ws.init_from).startswith("trio://"):  # remote engine state
        client.load_state(str(ws.init_from)).result()
        return {}
    if ws.init_from or ws.name == EMBEDDED:
        source = ws.init_from or EMBEDDED
        if source != EMBEDDED and not Path(source).expanduser().is_dir():
            raise FileNotFoundError(f"warmstart.init_from={source}: no such adapter directory")
        directory = asset_dir(cfg) if source == EMBEDDED else Path(source).expanduser()
        if source == EMBEDDED:
            cache.check_asset(directory, cfg)
        _load(cfg, client, directory)
        return {}
    if ws.name == "none":
        return {}
    if ws.name != "oracle_sft":
        raise ValueError(f"unknown warmstart {ws.name!r}; valid: none, oracle_sft, embedded")
    return await oracle_sft(cfg, client, dataset, rollout, tracker, run_dir)


async def oracle_sft(cfg: DictConfig, client, dataset, rollout, tracker,
                     run_dir: Path) -> dict[str, float]:
    """The cached SFT: reuse ``<cache>/<full fingerprint>`` or compute and store it."""
    key = cache.fingerprint(cache.full_inputs(cfg))
    if not cfg.warmstart.cache:
        metrics, _ = await _train(cfg, client, dataset, rollout, tracker, run_dir / "warmstart")
        return metrics
    entry = cache.cache_root(cfg) / key
    with cache.locked(cache.cache_root(cfg) / f"{key}.lock"):
        if (entry / cache.FINGERPRINT_FILE).exists():
            log.info("warm start: cache hit %s", entry)
            _load(cfg, client, entry)
            return {"warmstart/cached": 1.0, **cache.read_record(entry).get("metrics", {})}
        metrics, _ = await _train(cfg, client, dataset, rollout, tracker, entry)
    return {"warmstart/cached": 0.0, **metrics}


async def _train(cfg: DictConfig, client, dataset, rollout, tracker,
                 out_dir: Path) -> tuple[dict[str, float], Path]:
    """Render oracle trajectories, run the SFT, save (compact) to ``out_dir``, reload."""
    ws, t0 = cfg.warmstart, time.perf_counter()
    renderer = OracleRenderer(rollout.protocol, rollout.retriever, rollout.topk, rollout.cfg,
                              dataset.corpus, ws.mix)
    train = await renderer.render_many(dataset.train, ws.steps * ws.batch_size, ws.seed)
    stats = renderer.stats
    heldout = await OracleRenderer(rollout.protocol, rollout.retriever, rollout.topk,
                                   rollout.cfg, dataset.corpus, ws.mix).render_many(
        dataset.dev[: ws.heldout_questions], ws.heldout_questions, ws.seed + 1)
    max_tokens = cfg.trainer.max_datum_tokens
    log.info("warm start: %d oracle trajectories to train on; held-out cross-entropy of %d "
             "(one forward pass), then %d steps of %d", len(train), len(heldout), ws.steps, ws.batch_size)
    before = heldout_nll(client, heldout, max_tokens)
    losses = run_sft(client, train, steps=ws.steps, batch_size=ws.batch_size,
                     learning_rate=ws.learning_rate, seed=ws.seed, adam=_adam(cfg),
                     max_tokens=max_tokens, log_fn=tracker.log if tracker else None)
    after = heldout_nll(client, heldout, max_tokens)
    metrics = {
        "warmstart/final_loss": losses[-1], "warmstart/first_loss": losses[0],
        "warmstart/heldout_nll_before": before, "warmstart/heldout_nll_after": after,
        "warmstart/trajectories": float(len(train)),
        "warmstart/skipped": float(stats.skipped_budget + stats.skipped_unreachable),
        "warmstart/failed_search_share": stats.failed_searches / max(stats.searches, 1),
        "warmstart/searches_per_trajectory": stats.searches / max(stats.rendered, 1),
        "warmstart/seconds": time.perf_counter() - t0,
    }
    log.info("warm start: %s", {k: round(v, 4) for k, v in metrics.items()})
    directory = save(cfg, client, out_dir, metrics)
    if cfg.engine.name != "trio":
        _load(cfg, client, directory)
    return metrics, directory


def save(cfg: DictConfig, client, out_dir: Path, metrics: dict[str, float]) -> Path:
    """Save the client's adapters in the compact form (or record the remote path)."""
    record = cache.fingerprint_record(cfg, metrics=metrics)
    saved = client.save_weights_for_sampler(f"warmstart-{record['full']}").result().path
    if str(saved).startswith("trio://") or not Path(saved).is_dir():
        state = client.save_state(f"warmstart-{record['full']}").result().path
        return cache.write_remote(out_dir, record, state)
    return cache.write_compact(Path(saved), out_dir, record)


async def run_sft_mode(cfg: DictConfig, app, run_dir: Path, tracker) -> dict[str, float]:
    """``mode=sft``: the warm start alone; adapters exported to ``run_dir/warmstart_adapter``."""
    if cfg.warmstart.name != "oracle_sft":
        raise ValueError(f"mode=sft trains the oracle warm start: add warmstart=oracle_sft "
                         f"(got warmstart={cfg.warmstart.name})")
    client = app.service.create_lora_training_client(rank=cfg.model.lora_rank, seed=cfg.seed)
    metrics = await apply_warm_start(cfg, client, app.dataset, app.rollout, tracker, run_dir)
    out = run_dir / "warmstart_adapter"
    save(cfg, client, out, metrics)
    (out / "COMMAND").write_text(_command() + "\n")
    print(f"warm-start adapters saved to {out}")
    print(f"ship them with: cp -r {out} searchr1/warmstart/assets/<name>/")
    return {**metrics, "warmstart/adapter_bytes": float(
        sum(p.stat().st_size for p in out.rglob("*") if p.is_file()))}


def _command() -> str:
    """The command line of this run (Hydra's task overrides), recorded beside the adapter."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not inside a Hydra app
        overrides = []
    return " ".join(["python -m searchr1.main", *overrides])
