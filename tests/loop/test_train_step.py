"""The step pipeline on a tiny local model: KL placements against a reference loop written
here, mini-batching that consumes every trajectory once, metric combination, search
metrics that only count the step's own searches, selection's degenerate groups, and a step
that sends the planned datums once and packs once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from searchr1.data.types import QAExample
from searchr1.engines.local.config import LocalEngineConfig, ModelConfig
from searchr1.engines.local.service import LocalService
from searchr1.losses.config import Aggregation, EntropyEstimate, KLConfig, LossConfig
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.step_metrics import SearchCounts
from searchr1.advantages.config import AdvantageConfig, DegenerateRule
from searchr1.rollout.config import RolloutConfig
from searchr1.loop.config import TrainerConfig
from searchr1.advantages import ADVANTAGES
from searchr1.loop.train_step import SamplerFailed, StepRunner, StepSettings, select_stage
from searchr1.loop.update import UpdateSettings, combine, minibatches
from searchr1.engines.base import EngineCapabilities
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever
from tests.helpers.step_batches import batch_from_rows, one_turn, trajectory
from tests.loop.test_trainer import TextProtocol, vowel_reward

QS = [QAExample(id=f"q{i}", question=f"question {i}", golden_answers=("a",), data_source="t")
      for i in range(4)]


class Recorder:
    """A training client that records every forward_backward(_custom) call."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[str, list, object]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        fut = self.inner.forward_backward(data, loss_fn, loss_fn_config)
        self.calls.append(("builtin", list(data), fut.result()))
        return fut

    def forward_backward_custom(self, data, loss_fn, loss_fn_config=None):
        fut = self.inner.forward_backward_custom(data, loss_fn, loss_fn_config)
        self.calls.append(("custom", list(data), fut.result()))
        return fut


def make_runner(tiny_model_dir, tmp_path, loss: LossConfig, group_size=3, *, advantage=None,
                reward=vowel_reward, **trainer):
    engine = LocalEngineConfig(device="cpu", batch_window_ms=1.0)
    model = ModelConfig(name="tiny", hf_id=str(tiny_model_dir), gguf_file=None, lora_rank=4, lora_alpha=8)
    tcfg = TrainerConfig(learning_rate=1e-2, **trainer)
    service = LocalService(engine, model, tmp_path, tcfg)
    client = service.create_lora_training_client(rank=4, seed=0)
    rcfg = RolloutConfig(group_size=group_size, max_turns=1, max_turn_tokens=10, max_trajectory_tokens=64)
    rollout = RolloutEngine(TextProtocol(service.get_tokenizer()), SlowRetriever(0.0), 1, rcfg)
    advantage = advantage or AdvantageConfig(name="grpo_std", skip_degenerate_groups=False)
    settings = StepSettings(rcfg, advantage, UpdateSettings.from_configs(loss, tcfg),
                            tcfg.max_datum_tokens, seed=0)
    return StepRunner(settings, rollout, reward), Recorder(client), service


def direct_logprobs(model, datum, adapters: bool) -> torch.Tensor:
    """log π(target) at every position of one datum, by a plain forward (the test's loop)."""
    ids = torch.tensor([datum.model_input.to_ints()])
    tgt = torch.as_tensor(datum.loss_fn_inputs["target_tokens"].to_numpy())
    with torch.no_grad():
        if adapters:
            logits = model(input_ids=ids).logits[0]
        else:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0]
    lp = torch.log_softmax(logits.double(), -1).gather(-1, tgt.clamp(min=0)[:, None])[:, 0]
    return torch.where(tgt != -100, lp, torch.zeros_like(lp))


def col(datum, key) -> torch.Tensor:
    return torch.as_tensor(datum.loss_fn_inputs[key].to_numpy()).double()


def test_kl_in_the_loss_matches_a_reference_loop(tiny_model_dir, tmp_path):
    # entropy=sampled: the reference loop's entropy term is −logp of the sampled tokens (the
    # exact per-position entropy only matched it to 1e-3 by luck of the sampled tokens)
    loss = LossConfig(name="ppo", kl=KLConfig(coef=0.5, estimator="low_var_kl", placement="loss"),
                      entropy_coef=0.01, entropy=EntropyEstimate.sampled, old_logprobs="recompute",
                      aggregation=Aggregation.seq_mean_token_mean)
    runner, client, service = make_runner(tiny_model_dir, tmp_path, loss)
    model = service.training.model
    torch.manual_seed(1)
    for name, p in model.named_parameters():  # move the policy away from the reference
        if "lora_B" in name:
            p.data.normal_(0.0, 0.3)
    before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    expected_inputs = []

    orig = client.inner.forward_backward_custom

    def capture(data, fn, cfg=None):  # the test's own loop runs on the pre-update weights
        expected_inputs.append([(direct_logprobs(model, d, True), direct_logprobs(model, d, False)) for d in data])
        return orig(data, fn, cfg)

    client.inner.forward_backward_custom = capture
    metrics = asyncio.run(runner.run(client, QS[:2], 0, 0, lambda k: 1e-2))
    (kind, data, fb), = client.calls
    assert kind == "custom"
    # the reference loop: ppo clip, entropy −logp, low_var_kl vs the adapters-off model,
    # each the mean over trajectories of their token means (order-independent)
    rows = []
    for d, (lp, ref) in zip(data, expected_inputs[0]):
        mask = (col(d, "target_tokens") != -100).double()
        # the recomputed baseline is the pre-update log-prob (one mini-batch: the update
        # takes it from its own forward, so the datum's column is only a placeholder)
        q, adv = lp * mask, col(d, "advantages")
        ratio = torch.exp(torch.where(mask > 0, lp - q, torch.zeros_like(lp)))
        pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        dd = (ref - lp).clamp(-20, 20)
        kl = (torch.exp(dd) - dd - 1).clamp(-10, 10)
        rows.append([float((x * mask).sum() / mask.sum()) for x in (pg, -lp, kl)])
    pg, ent, kl = np.mean(rows, axis=0)
    assert len(data) == 6
    assert fb.metrics["loss_mean"] == pytest.approx(pg - 0.01 * ent + 0.5 * kl, abs=1e-5)
    assert metrics["train/kl"] == pytest.approx(kl, abs=1e-6)
    assert kl > 0
    after = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_kl_in_the_reward_matches_a_reference_loop(tiny_model_dir, tmp_path):
    loss = LossConfig(name="ppo", kl=KLConfig(coef=0.5, estimator="k1", placement="reward"))
    runner, client, service = make_runner(tiny_model_dir, tmp_path, loss)
    model = service.training.model
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0.0, 0.3)
    metrics = asyncio.run(runner.run(client, QS[:2], 0, 0, lambda k: 1e-2))
    (kind, data, fb), = client.calls
    assert kind == "builtin"  # token_mean, no entropy, no KL in the loss: pytrio's own ppo
    kls = []
    for d in data:
        mask = (col(d, "target_tokens") != -100).double()
        q = col(d, "logprobs")  # sampler log-probs (old_logprobs=sampler)
        ref = direct_logprobs(model, d, False)
        k1 = (q - ref) * mask
        adv = col(d, "advantages")
        scalar = float(((adv + 0.5 * k1) * mask).sum() / mask.sum())
        # advantages = the group's scalar on every action token − coef·k1(q, ref)
        assert torch.allclose(adv, (scalar - 0.5 * k1) * mask, atol=1e-4)
        kls.append(k1[mask > 0])
    assert metrics["train/kl"] == pytest.approx(float(torch.cat(kls).mean()), abs=1e-4)


def test_ten_optimizer_steps_consume_each_trajectory_once(tiny_model_dir, tmp_path):
    runner, client, _ = make_runner(tiny_model_dir, tmp_path, LossConfig(name="ppo"),
                                    group_size=5, minibatch_trajectories=2)
    metrics = asyncio.run(runner.run(client, QS, 0, 0, lambda k: 1e-3 * (k + 1)))
    assert len(client.calls) == 10
    assert all(len(data) == 2 for _, data, _ in client.calls)
    sent = [id(d) for _, data, _ in client.calls for d in data]
    assert len(sent) == len(set(sent)) == 20  # every trajectory's datum exactly once
    assert metrics["train/optimizer_steps"] == 10.0
    assert metrics["train/step"] == 10.0  # the optimizer's count after the last step, not a mean
    assert metrics["train/lr"] == pytest.approx(1e-2)  # the last mini-batch's LR (k = 9)


@pytest.mark.parametrize(("group_size", "rule", "steps"), [
    (6, DegenerateRule.zero_advantages, 1),  # the lab: A = 2^-56 ≠ 0, trained, one step
    (6, DegenerateRule.equal_rewards, 0),  # ours: equal rewards, dropped, no step
    (8, DegenerateRule.zero_advantages, 0),  # the lab on Python ≥ 3.13: A = 0.0 exactly
])
def test_an_all_penalty_step_under_the_labs_degenerate_rule(tiny_model_dir, tmp_path, group_size,
                                                             rule, steps):
    """Every trajectory scores −0.1 (the lab's no-answer penalty). The lab's train.py builds
    a datum for every trajectory whose float advantage is not exactly 0.0 and takes an
    optimizer step when any datum exists; its mean of six −0.1 is one ulp off (advantages
    2^-56, tests/advantages/test_estimators.py), so it steps, and Adam moves LoRA B off zero."""
    advantage = AdvantageConfig(name="group_mean", degenerate=rule)
    loss = LossConfig(name="importance_sampling", aggregation=Aggregation.seq_mean_token_mean)
    runner, client, service = make_runner(tiny_model_dir, tmp_path, loss, group_size=group_size,
                                          advantage=advantage, reward=lambda inp: -0.1,
                                          eps=1e-12, grad_clip_norm=0.0)
    lora_b = {k: v.clone() for k, v in service.training.model.state_dict().items() if "lora_B" in k}
    metrics = asyncio.run(runner.run(client, QS[:1], 0, 0, lambda k: 4e-5))
    assert metrics["rollout/degenerate_group_rate"] == float(steps == 0)
    assert metrics.get("train/optimizer_steps", 0.0) == steps
    assert len(client.calls) == steps and all(len(data) == group_size for _, data, _ in client.calls)
    after = service.training.model.state_dict()
    moved = any(not torch.equal(lora_b[k], after[k]) for k in lora_b)
    assert moved == bool(steps)


def test_combine_sums_counters_and_averages_rates():
    out = combine([{"train/token_count": 3.0, "train/loss": 1.0, "train/step": 1.0, "train/entropy": 5.0},
                   {"train/token_count": 4.0, "train/loss": 3.0, "train/step": 2.0, "train/entropy": 9.0}])
    assert out == {"train/token_count": 7.0, "train/loss": 2.0, "train/step": 2.0, "train/entropy": 5.0}


def test_minibatches_split_contiguously():
    assert minibatches(5, 2) == [[0, 1], [2, 3], [4]]
    assert minibatches(5, 0) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError):
        minibatches(3, -1)


class FakeClient:
    """No training: every group is degenerate (equal rewards) and skipped, so no update."""

    capabilities = EngineCapabilities()  # a remote-like engine: nothing in process

    def __init__(self, sampler):
        self.sampler = sampler

    def save_weights_and_get_sampling_client(self):
        return self.sampler


def test_a_step_whose_every_trajectory_failed_in_the_sampler_stops_the_run():
    class Broken:
        async def sample_async(self, prompt, num_samples=1, sampling_params=None):
            raise RuntimeError("CUDA Error: out of memory")

    rcfg = RolloutConfig(group_size=2, max_turns=2, max_searches=1, max_turn_tokens=8)
    rollout = RolloutEngine(CharProtocol(), SlowRetriever(0.0), 1, rcfg)
    settings = StepSettings(rcfg, AdvantageConfig(name="group_mean"), UpdateSettings(LossConfig()), seed=0)
    runner = StepRunner(settings, rollout, lambda inp: 0.0)
    with pytest.raises(SamplerFailed, match="every trajectory ended in a sampler error"):
        asyncio.run(runner.run(FakeClient(Broken()), QS[:2], 0, 0, lambda k: 0.0))


def test_a_step_then_an_eval_then_a_step_counts_only_each_steps_searches():
    retriever = SlowRetriever(0.0)
    rcfg = RolloutConfig(group_size=2, max_turns=4, max_searches=3, max_turn_tokens=40)
    rollout = RolloutEngine(CharProtocol(), retriever, 1, rcfg)
    settings = StepSettings(rcfg, AdvantageConfig(name="group_mean"),
                            UpdateSettings(LossConfig()), seed=0)
    runner = StepRunner(settings, rollout, lambda inp: 0.0)

    def searches(n):
        def script(prompt, i):
            return "S:x;" if prompt.count("[") < n else "A:a;"
        return ScriptedSampler(script)

    m1 = asyncio.run(runner.run(FakeClient(searches(1)), QS[:2], 0, 0, lambda k: 0.0))
    # an eval with the same retriever: 3 searches per trajectory
    asyncio.run(rollout.rollout(searches(3), QS[:2], 1, SamplingSettings(temperature=0.0, seed=0)))
    m2 = asyncio.run(runner.run(FakeClient(searches(2)), QS[:2], 1, 0, lambda k: 0.0))
    assert m1["search/step_requests"] == 4.0  # 2 questions × 2 trajectories × 1 search
    assert m2["search/step_requests"] == 8.0  # × 2 searches; the eval's 6 are not counted
    assert m2["search/requests"] == 12.0  # cumulative over the run's own steps (lab)
    assert m2["rollout/search_calls"] == 2.0
    assert m2["train/update_skipped"] == 1.0
    assert isinstance(runner.search_totals, SearchCounts)


def test_ppo_gae_step_with_a_critic_and_kl_in_the_reward(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from searchr1.engines.local.training.critic import Critic
    from searchr1.advantages.config import CriticConfig

    loss = LossConfig(name="ppo", kl=KLConfig(coef=0.1, estimator="k1", placement="reward"),
                      entropy_coef=0.001, old_logprobs="recompute",
                      aggregation=Aggregation.microbatch_token_mean)
    runner, client, _ = make_runner(tiny_model_dir, tmp_path, loss, group_size=1,
                                    minibatch_trajectories=2, microbatch_trajectories=1)
    runner.s = StepSettings(runner.s.rollout, AdvantageConfig(name="ppo_gae"), runner.s.update, 8192, 0)
    critic = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                    CriticConfig(lora_rank=4, lora_alpha=8, warmup_ratio=0.0), 10, 0, "cpu")
    runner.critic = critic
    metrics = asyncio.run(runner.run(client, QS, 0, 0, lambda k: 1e-3))
    assert len(client.calls) == 2 and all(kind == "custom" for kind, _, _ in client.calls)
    adv = torch.cat([col(d, "advantages")[col(d, "target_tokens") != -100]
                     for _, data, _ in client.calls for d in data])
    assert abs(float(adv.mean())) < 1e-6 and float(adv.std()) == pytest.approx(1.0, abs=1e-3)  # whitened
    for key in ("critic/value_loss", "critic/vf_clipfrac", "critic/values_mean",
                "critic/explained_variance", "train/kl", "train/entropy"):
        assert key in metrics, key
    assert critic.steps == 2  # one critic step per actor mini-batch


def test_loss_micro_batches_follow_rollout_order_not_send_order():
    from searchr1.loop.update import objective

    rng = np.random.default_rng(0)
    lengths = (3, 5, 2, 4)
    batch = batch_from_rows([rng.integers(3, 90, size=n + 1) for n in lengths], [np.ones(n) for n in lengths],
                            [-rng.random(n) for n in lengths], [rng.normal(size=n) for n in lengths])
    s = UpdateSettings(LossConfig(name="importance_sampling", aggregation="microbatch_token_mean"),
                       microbatch_trajectories=2)
    sent = [1, 3, 0, 2]  # e.g. FFD: longest first
    fn = objective(s, batch, [0, 1, 2, 3], sent)
    logp = [torch.as_tensor(batch.row("old_T", i)) for i in sent]  # ratio 1: loss = −A
    loss, _ = fn(None, logp)
    micro = [np.concatenate([-batch.row("advantages_T", i) for i in m]).mean() for m in ([0, 1], [2, 3])]
    assert float(loss) == pytest.approx(float(np.mean(micro)), rel=1e-10)


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "seq_mean_token_sum", "microbatch_token_mean"])
def test_builtin_with_weighted_advantages_equals_the_custom_objective(tiny_model_dir, tmp_path, mode):
    from searchr1.loop.update import call_weights, objective

    _, client, service = make_runner(tiny_model_dir, tmp_path, LossConfig(name="ppo"))
    rng = np.random.default_rng(0)
    tokens, masks, logprobs, advantages = [], [], [], []
    for n in (9, 5, 12, 7):
        tokens.append(rng.integers(3, 90, size=n))
        mask = (rng.random(n - 1) < 0.7).astype(float)
        mask[0] = 1.0
        masks.append(mask)
        logprobs.append(-rng.random(n - 1) * mask - 4.0 * mask)
        advantages.append(rng.normal(size=n - 1))
    batch = batch_from_rows(tokens, masks, logprobs, advantages, n_trajectories=6)  # 2 dropped
    s = UpdateSettings(LossConfig(name="ppo", aggregation=mode), microbatch_trajectories=3)
    part, sent = [0, 1, 2, 3], [2, 0, 3, 1]
    w = call_weights(s, batch, part)
    params = [p for p in service.training.model.parameters() if p.requires_grad]

    def grads(fb_call):
        for p in params:
            p.grad = None
        fb = fb_call().result()
        return fb.metrics["loss_mean"], torch.cat([p.grad.flatten() for p in params])

    loss_b, g_b = grads(lambda: client.inner.forward_backward(batch.datums(sent, [w[i] for i in sent]), "ppo",
                                                              {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}))
    loss_c, g_c = grads(lambda: client.inner.forward_backward_custom(batch.datums(sent),
                                                                     objective(s, batch, part, sent)))
    assert loss_b == pytest.approx(loss_c, rel=1e-5)
    assert torch.allclose(g_b, g_c, rtol=1e-4, atol=1e-7)


class ForwardCounter(Recorder):
    """A Recorder that also records which datums each no-gradient ``forward`` scored."""

    def __init__(self, inner):
        super().__init__(inner)
        self.scored: list[int] = []

    def forward(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        self.scored.append(len(data))
        return self.inner.forward(data, loss_fn, loss_fn_config)


def test_recomputed_old_logprobs_score_only_later_minibatches_and_match(tiny_model_dir, tmp_path):
    """Mini-batch 0 takes its ratio baseline from its own forward: the recompute pass scores
    the later mini-batches only, and the step's update and metrics are those of recomputing
    everything first (the same weights give the same log-probs)."""
    loss = LossConfig(name="ppo", kl=KLConfig(coef=0.5, estimator="low_var_kl", placement="loss"),
                      entropy_coef=0.01, entropy=EntropyEstimate.sampled, old_logprobs="recompute")
    keys = ("train/loss", "train/kl", "train/kl_sampled", "train/ratio_mean", "train/clip_fraction")
    out = {}
    for on_policy in (True, False):
        runner, client, service = make_runner(tiny_model_dir, tmp_path / str(on_policy), loss, group_size=3,
                                              minibatch_trajectories=3)
        client = ForwardCounter(client.inner)
        runner.first_minibatch_on_policy = on_policy
        torch.manual_seed(1)
        for name, p in service.training.model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0.0, 0.3)
        train, batches = runner.train, []

        async def train_shifted(client, batch, *args):
            # the sampler's log-probs moved off the trainer's: a placeholder left in old_T shows
            batch.sampler_T = batch.sampler_T - batch.mask_T
            batches.append(batch)
            return await train(client, batch, *args)

        runner.train = train_shifted
        metrics = asyncio.run(runner.run(client, QS[:2], 0, 0, lambda k: 1e-2))
        assert len(client.calls) == 2  # 6 trajectories, 3 per optimizer step
        assert client.scored == ([3] if on_policy else [6])
        sent = [d.model_input.to_ints() for _, data, _ in client.calls for d in data]
        lora = {k: v.clone() for k, v in service.training.model.state_dict().items() if "lora_" in k}
        out[on_policy] = sent, lora, {k: metrics[k] for k in keys if k in metrics}, batches[0].old_T
    (sent_f, lora_f, got_f, old_f), (sent_r, lora_r, got_r, old_r) = out[True], out[False]
    assert sent_f == sent_r  # the same rollout in both
    assert np.allclose(old_f, old_r, atol=1e-6)  # mini-batch 0's rows filled by its own call
    assert "train/kl_sampled" in got_r and "train/kl" in got_r and got_f.keys() == got_r.keys()
    for k in lora_r:
        assert torch.allclose(lora_f[k], lora_r[k], atol=1e-6), k
    for k, v in got_r.items():
        assert got_f[k] == pytest.approx(v, abs=1e-6), k


def test_the_on_policy_objective_ignores_the_old_column_and_equals_a_detached_baseline():
    from searchr1.loop.update import objective

    rng = np.random.default_rng(0)
    lengths = (4, 6, 3)
    batch = batch_from_rows([rng.integers(3, 90, size=n + 1) for n in lengths], [np.ones(n) for n in lengths],
                            [-rng.random(n) for n in lengths], [rng.normal(size=n) for n in lengths])
    s = UpdateSettings(LossConfig(name="ppo", kl=KLConfig(coef=0.1, placement="loss"), entropy_coef=0.01,
                                  entropy=EntropyEstimate.sampled, old_logprobs="recompute"))
    batch.ref_T = batch.sampler_T - 0.3
    part = sent = [0, 1, 2]
    logp = [torch.as_tensor(-rng.random(n) - 0.5, dtype=torch.float64).requires_grad_() for n in lengths]

    def loss_and_grad(fn):
        for x in logp:
            x.grad = None
        loss, _ = fn(None, logp)
        loss.backward()
        return float(loss.detach()), [x.grad.clone() for x in logp]

    batch.old_T = np.full_like(batch.sampler_T, 123.0)  # garbage: the on-policy objective never reads it
    fused = loss_and_grad(objective(s, batch, part, sent, on_policy=True))
    batch.set_rows("old_T", [x.detach().numpy() for x in logp])
    plain = loss_and_grad(objective(s, batch, part, sent))
    assert fused[0] == pytest.approx(plain[0], rel=1e-12)
    for a, b in zip(fused[1], plain[1]):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-15)
    # the separable form (one pass per micro-batch) agrees
    fn = objective(s, batch, part, sent, on_policy=True)
    batch.old_T[:] = -50.0
    part_loss, _ = fn.separable.part([0, 1, 2], logp)
    assert float(part_loss.detach()) == pytest.approx(plain[0], rel=1e-12)


def test_the_first_minibatch_is_on_policy_only_where_the_update_allows_it():
    kl_loss, kl_reward = KLConfig(coef=0.1, placement="loss"), KLConfig(coef=0.1, placement="reward")
    custom = dict(name="ppo", entropy_coef=0.01, kl=kl_loss)
    assert UpdateSettings(LossConfig(old_logprobs="recompute", **custom)).first_minibatch_on_policy
    assert not UpdateSettings(LossConfig(old_logprobs="sampler", **custom)).first_minibatch_on_policy
    # a KL penalty in the reward needs every old log-prob before the advantages
    assert not UpdateSettings(LossConfig(name="ppo", entropy_coef=0.01, kl=kl_reward,
                                         old_logprobs="recompute")).first_minibatch_on_policy
    # a built-in loss reads the baseline from the datums
    assert not UpdateSettings(LossConfig(name="ppo", old_logprobs="recompute")).first_minibatch_on_policy


def test_degenerate_groups_are_a_group_baseline_notion():
    groups = [[one_turn(1.0), one_turn(1.0, 1)], [one_turn(1.0), one_turn(0.0, 1)]]
    grpo = select_stage(groups, ADVANTAGES.get("grpo_std"), skip_degenerate=True)
    assert grpo.degenerate_rate == 0.5 and grpo.group_D == [0, 0] and len(grpo.rewards_G) == 1
    kept = select_stage(groups, ADVANTAGES.get("grpo_std"), skip_degenerate=False)
    assert kept.degenerate_rate == 0.5 and kept.group_D == [0, 0, 1, 1]
    gae = select_stage(groups, ADVANTAGES.get("ppo_gae"), skip_degenerate=True)
    assert gae.degenerate_rate == 0.0 and len(gae.trajs_D) == 4  # a critic sees signal anyway
    only_obs = trajectory([1, 2, 3], [0, 0, 0], [0, 0, 0], prompt_len=1)  # observation, no action
    assert select_stage([[only_obs]], ADVANTAGES.get("grpo_std"), True).trajs_D == []
    assert len(select_stage([[only_obs]], ADVANTAGES.get("grpo_std"), True, mask_observations=False).trajs_D) == 1


def test_a_step_sends_the_planned_datums_once_and_packs_once(tiny_model_dir, tmp_path, monkeypatch):
    import searchr1.loop.update as update

    calls = []
    real = update.pack_ffd
    monkeypatch.setattr(update, "pack_ffd", lambda *a: calls.append(a) or real(*a))
    runner, client, _ = make_runner(tiny_model_dir, tmp_path, LossConfig(name="importance_sampling"),
                                    group_size=3, minibatch_trajectories=2)
    metrics = asyncio.run(runner.run(client, QS[:2], 0, 0, lambda k: 1e-3))
    assert len(calls) == len(client.calls) == 3  # one packing per mini-batch, not one more
    sent = [d for _, data, _ in client.calls for d in data]
    targets = [d.loss_fn_inputs["target_tokens"].to_numpy() for d in sent]
    assert metrics["train/loss_tokens_per_rollout_batch"] == float(sum((t != -100).sum() for t in targets))
    assert metrics["train/datums"] == metrics["train/datums_per_rollout_batch"] == len(sent) == 6
    assert metrics["train/tokens_per_rollout_batch"] == float(sum(len(t) for t in targets))
    # grpo_std is mean-centred per group: the scalars of each question's datums sum to 0
    by_question = {}
    for d, t in zip(sent, targets):
        scalar = float(d.loss_fn_inputs["advantages"].to_numpy()[t != -100][0])
        by_question.setdefault(tuple(d.model_input.to_ints()[:14]), []).append(scalar)
    assert sorted(len(v) for v in by_question.values()) == [3, 3]
    assert all(abs(sum(v)) < 1e-5 for v in by_question.values())
