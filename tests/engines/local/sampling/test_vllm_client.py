"""The vLLM sampler on CPU, against a fake of vLLM at the API boundary (tests/helpers/fake_vllm.py).

What crosses the boundary (params per sequence: seeds, stops, caps, log-prob mode), what comes
back (tokens, log-probs, the rule's cut), the weights (pushed when their version changes, after
a drain; LoRA folded under HF names), sleep and wake, failures, and the errors a user sees.
"""

from __future__ import annotations

import asyncio
import pytest
import torch
from peft import LoraConfig, get_peft_model
from pytrio import ModelInput, SamplingParams
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.sampling.requests import row_seed
from searchr1.engines.local.sampling.slot_types import WeightsSource
from searchr1.engines.local.sampling.stops import LENGTH, StopRule
from searchr1.engines.local.sampling.vllm_client import VllmSamplingClient
from searchr1.engines.local.sampling.vllm_engine import VllmEngine
from searchr1.engines.local.sampling.vllm_setup import hf_weights
from tests.helpers.fake_vllm import FakeVllmApi

VOCAB = 50


class _Tok:
    eos_token_id = 2
    pad_token_id = 0

    def __len__(self) -> int:
        return VOCAB

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)


def _model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


class Rig:
    """A fake vLLM engine, its worker and a client over ``model`` with a settable weights version."""

    def __init__(self, model=None, detokenize: bool = True, sleep_level: int = 2, max_len: int = 64,
                 seeded: bool = True) -> None:
        self.api = FakeVllmApi(VOCAB, decode=_Tok().decode)
        self.model = model or _model()
        self.version = 0
        self.lock = None
        engine = self.api.open_engine({})
        self.worker = VllmEngine(self.api, engine, hf_weights, sleep_level)
        self.source = WeightsSource(self.model, lambda: self.version, None)
        self.client = VllmSamplingClient(self.worker, self.source, _Tok(), max_len, scorer=None,
                                         detokenize=detokenize, seeded=seeded, seed=7)

    def sample(self, prompt, n=1, **params):
        return self.client.sample(ModelInput.from_ints(prompt), n, SamplingParams(**params)).result(timeout=30)

    def close(self):
        self.worker.close()


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def test_params_cross_the_boundary_as_the_rule_says() -> None:
    r = Rig(max_len=64)
    seen = []
    original = r.api.sampling_params
    r.api.sampling_params = lambda **kw: seen.append(kw) or original(**kw)
    try:
        r.sample([5, 6, 7], n=2, max_tokens=100, seed=11, temperature=0.7, top_p=0.9, top_k=5, stop=["<9>"])
    finally:
        r.close()
    assert len([c for c in r.api.calls if c[0] == "add"]) == 2  # a request per sequence, not n=2
    assert [kw["seed"] for kw in seen] == [row_seed(11, 0), row_seed(11, 1)]
    for kw in seen:
        assert kw["max_tokens"] == 64 + 1 - 3  # capped like a slot: prompt + generated ≤ max_seq_len + 1
        assert kw["stop"] == ["<9>"] and kw["stop_token_ids"] == [2] and kw["detokenize"] is True
        assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (0.7, 0.9, 5)


def test_unseeded_mode_sends_no_seed_and_a_prompt_too_long_is_refused() -> None:
    r = Rig(seeded=False, max_len=8)
    seen = []
    original = r.api.sampling_params
    r.api.sampling_params = lambda **kw: seen.append(kw) or original(**kw)
    try:
        r.sample([5, 6], max_tokens=4, seed=3)
        with pytest.raises(Exception, match="does not fit engine.max_seq_len=8"):
            r.sample(list(range(3, 13)), max_tokens=4)
    finally:
        r.close()
    assert seen[0]["seed"] is None


def test_tokens_and_logprobs_come_back_as_drawn_and_the_same_seed_draws_the_same(rig) -> None:
    a = rig.sample([5, 6, 7], n=2, max_tokens=6, seed=11, stop=[2])
    b = rig.sample([5, 6, 7], n=2, max_tokens=6, seed=11, stop=[2])
    for s in a.sequences:
        assert len(s.tokens) == len(s.logprobs) and all(lp < 0 for lp in s.logprobs)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert a.sequences[0].tokens != a.sequences[1].tokens  # each sequence its own seed


def _slot_rule_cut(tokens: list[int], rule: StopRule) -> tuple[int, str] | None:
    """The slot sampler's cut: the rule checked token by token."""
    for n in range(1, len(tokens) + 1):
        ending = rule.check(tokens[:n], 1)
        if ending is not None:
            return ending.length, ending.reason
    return None


@pytest.mark.parametrize("detokenize", [True, False])
def test_the_cut_is_the_slot_samplers_on_the_same_tokens(detokenize) -> None:
    """Whether vLLM matched the strings itself (it has the tokenizer) or not (random-weight
    benchmarks), the kept tokens are those the slot sampler's token-by-token rule keeps."""
    r = Rig(detokenize=detokenize)
    rule = StopRule(frozenset({2}), ("<7><1", "<4>"), _Tok().decode, 12)
    try:
        for seed in range(40):
            out = r.sample([3, 4], n=1, max_tokens=12, seed=seed, stop=["<7><1", "<4>"]).sequences[0]
            raw = [r.api.draw(row_seed(seed, 0), [3, 4], i, r.api.engine.weights_version) for i in range(12)]
            expected = _slot_rule_cut(raw, rule)
            assert expected is not None
            assert (len(out.tokens), out.stop_reason) == expected and out.tokens == raw[: expected[0]]
    finally:
        r.close()


def test_a_new_weights_version_is_pushed_after_the_drain_and_shows_in_the_next_sample(rig) -> None:
    first = rig.sample([5, 6], max_tokens=5, seed=1)
    pushes = [c for c in rig.api.calls if c[0] == "load_weights"]
    assert len(pushes) == 1  # the dummy weights were replaced before the first sample
    with torch.no_grad():
        rig.model.model.norm.weight.add_(1.0)  # the trainer's optimizer step
    rig.version += 1
    again = rig.sample([5, 6], max_tokens=5, seed=1)
    assert len([c for c in rig.api.calls if c[0] == "load_weights"]) == 2
    assert again.sequences[0].tokens != first.sequences[0].tokens
    resets = [i for i, c in enumerate(rig.api.calls) if c[0] == "reset_prefix_cache"]
    loads = [i for i, c in enumerate(rig.api.calls) if c[0] == "load_weights"]
    assert all(any(r > load for r in resets) for load in loads)  # stale prefixes dropped after each push


def test_requests_of_other_weights_wait_until_the_engine_drains() -> None:
    r = Rig()
    r.sample([5], max_tokens=1, seed=0)  # the first push
    old_weights, mark = r.api.engine.weights_version, len(r.api.calls)
    r.api.step_delay = 0.01  # the old request is still decoding when the new weights arrive

    async def both():
        old = r.client.sample_async(ModelInput.from_ints([5, 6]), 2, SamplingParams(max_tokens=20, seed=1))
        task = asyncio.ensure_future(old)
        await asyncio.sleep(0.05)
        with torch.no_grad():
            r.model.model.norm.weight.add_(1.0)  # an optimizer step while the old request decodes
        r.version += 1
        new = await r.client.sample_async(ModelInput.from_ints([5, 6]), 1, SamplingParams(max_tokens=3, seed=1))
        return await task, new

    try:
        (old, _new) = asyncio.run(both())
        for i, seq in enumerate(old.sequences):  # every token of the old request: the old weights
            assert seq.tokens == [r.api.draw(row_seed(1, i), [5, 6], k, old_weights) for k in range(len(seq.tokens))]
        order = [c[0] for c in r.api.calls[mark:]]
        second_load = order.index("load_weights")
        adds = [i for i, c in enumerate(order) if c == "add"]
        assert adds[:2] == sorted(adds[:2]) and adds[1] < second_load < adds[2]
        assert r.api.engine.running == {}
    finally:
        r.close()


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_then_the_next_request_wakes_weights_pushes_then_the_kv_cache(level) -> None:
    r = Rig(sleep_level=level)
    try:
        r.sample([5, 6], max_tokens=3, seed=1)
        r.worker.request_sleep()
        deadline = 200
        while ("sleep", level) not in r.api.calls and deadline:
            deadline -= 1
            asyncio.run(asyncio.sleep(0.01))
        assert ("sleep", level) in r.api.calls and r.worker.asleep
        mark = len(r.api.calls)
        r.sample([5, 6], max_tokens=3, seed=1)
        after = [c[0] if c[0] != "wake_up" else c for c in r.api.calls[mark:]]
        wake_w, wake_kv = after.index(("wake_up", ("weights",))), after.index(("wake_up", ("kv_cache",)))
        pushed = "load_weights" in after[wake_w:wake_kv]
        assert pushed == (level == 2)  # level 1 kept the same weights on the host
        assert "reset_prefix_cache" in after[wake_kv:] and after.index("add") > wake_kv
        assert r.worker.stats.sleeps == 1 and not r.worker.asleep
    finally:
        r.close()


def test_a_failed_step_fails_its_requests_and_the_engine_keeps_serving(rig) -> None:
    rig.sample([5], max_tokens=2, seed=1)  # the first push
    rig.api.engine.fail_next_step = True
    with pytest.raises(RuntimeError, match="device error"):
        rig.sample([5, 6], max_tokens=3, seed=1)
    assert rig.sample([5, 6], max_tokens=3, seed=1).sequences[0].tokens


def test_hf_weights_names_the_checkpoint_keys_and_folds_lora() -> None:
    plain = _model(1)
    names = [n for n, _ in hf_weights(plain)]
    assert set(names) == set(plain.state_dict())
    model = get_peft_model(_model(1), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 init_lora_weights=False))
    folded = dict(hf_weights(model))
    assert set(folded) == set(plain.state_dict())  # no base_layer / lora_ names leak
    merged = model.merge_and_unload()
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(folded[name], tensor, rtol=0, atol=1e-6)


def test_vllm_sampler_counts_what_it_did(rig) -> None:
    out = rig.sample([5, 6, 7], n=2, max_tokens=4, seed=3)
    st = rig.worker.stats
    assert st.sequences == 2 and st.prompt_tokens == 6 and st.pushes == 1
    assert st.sampled_tokens == sum(len(s.tokens) for s in out.sequences)
    assert st.in_flight_steps == sum(len(s.tokens) for s in out.sequences)  # one token per sequence a step


def test_the_rule_ends_by_length_where_no_stop_came(rig) -> None:
    rig.sample([1], max_tokens=1, seed=0)  # the first push: the fake's weights are now known
    weights = rig.api.engine.weights_version
    seed = next(s for s in range(100) if 2 not in [rig.api.draw(row_seed(s, 0), [1], i, weights) for i in range(3)])
    out = rig.sample([1], max_tokens=3, seed=seed).sequences[0]
    assert (len(out.tokens), out.stop_reason) == (3, LENGTH)
