"""``mode=eval`` evaluates the policy a training run starts from: the warm start is applied."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from searchr1.engines.local.service import LocalService
from searchr1.loop.eval_mode import evaluated, run_eval_mode
from searchr1.rollout.engine import RolloutEngine
from tests.helpers.rollout_fakes import SlowRetriever
from tests.loop.test_trainer import TextProtocol, dataset, make_cfg, run_trainer, vowel_reward


def _eval(cfg, run_dir):
    service = LocalService(cfg.engine, cfg.model, run_dir, cfg.trainer)
    rollout = RolloutEngine(TextProtocol(service.get_tokenizer()), SlowRetriever(0.0), 1, cfg.rollout)
    app = SimpleNamespace(service=service, dataset=dataset(), rollout=rollout, reward_fn=vowel_reward)
    return asyncio.run(run_eval_mode(cfg, app, run_dir)), service


def test_eval_mode_applies_the_warm_start_and_says_so(tiny_model_dir, tmp_path, capsys):
    run_trainer(make_cfg(tiny_model_dir, steps=1, save_every=1), tmp_path / "donor")
    adapters = tmp_path / "donor/checkpoints/engine/sampler/step_000001"
    cfg = make_cfg(tiny_model_dir)
    cfg.warmstart.init_from = str(adapters)
    metrics, service = _eval(cfg, tmp_path / "eval")
    assert "eval/em/macro" in metrics and (tmp_path / "eval/trajectories.jsonl").is_file()
    assert f"mode=eval: tiny with the adapters in {adapters}" in capsys.readouterr().out
    loaded = {k: v for k, v in service.training.model.named_parameters() if "lora_B" in k}
    assert loaded and max(float(v.detach().abs().max()) for v in loaded.values()) > 0  # trained


def test_without_a_warm_start_the_base_model_is_evaluated_and_named(tiny_model_dir, tmp_path, capsys):
    cfg = make_cfg(tiny_model_dir)
    cfg.warmstart.name = "none"
    _, service = _eval(cfg, tmp_path)
    assert service.training is None  # no adapters: the base model's own sampler
    assert "mode=eval: the base model" in capsys.readouterr().out
    cfg.warmstart.name = "embedded"
    assert "packaged warm start (warmstart=embedded" in evaluated(cfg)
