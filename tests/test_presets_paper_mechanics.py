"""The mechanisms the paper presets select, against the official formulas: trained truncated
turns, the exact entropy of the chunked head, GAE over the response, verbatim BM25 titles."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from searchr1.advantages.gae import gae_domains, response_mask
from searchr1.engines.local.training.logprobs import label_logprobs_entropy
from searchr1.losses.config import KLConfig
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.advantages.config import AdvantageConfig
from searchr1.rollout.config import RolloutConfig
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever, dec, enc
from tests.test_config import _compose
from tests.protocols.test_tags_official import EX

MINI = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "hotpotqa_mini"


# ----------------------------------------------------------------------- 6. truncated turns


def test_turns_from_a_cut_context_are_trained_when_asked():
    # prompt "Q:who|" (6) + "S:ab;" (5) + "[d-ab]" (6) = 17 > 12: turn 2 sees the last 12
    script = lambda prompt, i: "S:ab;" if "[" not in prompt else "A:x;"
    cfg = RolloutConfig(max_prompt_tokens=12, train_truncated_turns=True)
    eng = RolloutEngine(CharProtocol(), SlowRetriever(0.0), topk=1, cfg=cfg)
    (traj,) = asyncio.run(eng.rollout_group(ScriptedSampler(script), EX, 1, SamplingSettings(0.0)))
    assert dec(traj.tokens_T) == "Q:who|S:ab;[d-ab]A:x;"
    assert traj.mask_T == [0] * 6 + [1] * 5 + [0] * 6 + [1] * 4  # turn 2 trained, as officially
    assert traj.logprobs_T[-4:] == [-0.1, -0.2, -0.3, -0.4]


def test_presets_train_truncated_turns_and_ours_is_one_override_away():
    for preset in ("paper_grpo", "paper_grpo_format", "paper_ppo"):
        assert _compose([f"experiment={preset}"]).rollout.train_truncated_turns is True
    assert _compose([]).rollout.train_truncated_turns is False


# ----------------------------------------------------------------------- 7. exact entropy


def _dense(hidden, weight, labels):
    logp_V = torch.log_softmax(hidden @ weight.T, -1)
    return logp_V.gather(-1, labels[:, None])[:, 0], -(logp_V.exp() * logp_V).sum(-1)


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_chunked_entropy_equals_the_dense_entropy_values_and_gradients(chunk):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 6, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (9,), generator=g)
    up_lp, up_h = torch.randn(9, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    logp, ent = label_logprobs_entropy(hidden, weight, labels, torch.float64, chunk)
    (logp * up_lp + ent * up_h).sum().backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want_lp, want_h = _dense(hidden, weight, labels)
    (want_lp * up_lp + want_h * up_h).sum().backward()
    assert torch.allclose(logp, want_lp, atol=1e-12) and torch.allclose(ent, want_h, atol=1e-12)
    assert torch.allclose(got[0], hidden.grad, atol=1e-12) and torch.allclose(got[1], weight.grad, atol=1e-12)


def test_uniform_logits_have_entropy_log_v():
    hidden, weight = torch.zeros(2, 3, dtype=torch.float64), torch.ones(5, 3, dtype=torch.float64)
    _, ent = label_logprobs_entropy(hidden, weight, torch.tensor([0, 4]), torch.float64, 1)
    assert torch.allclose(ent, torch.full((2,), float(np.log(5)), dtype=torch.float64))


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_engine_passes_the_exact_entropy_and_backpropagates_it(tmp_path, layout):
    from tests.engines.local.training.test_client import batch, field, lora_grads, make_client

    client = make_client(tmp_path, layout=layout, logits_chunk=3)
    data = batch(3, seed=5)
    seen = {}

    def loss_fn(data_, logprobs_D, *, entropy_D=None):
        seen["ent"] = [e.detach().clone() for e in entropy_D]
        return sum((lp.sum() - 0.5 * e.sum()) for lp, e in zip(logprobs_D, entropy_D)), {}

    loss_fn.wants_entropy = True
    client.forward_backward_custom(data, loss_fn).result()
    got = lora_grads(client)
    client.model.zero_grad(set_to_none=True)
    want_loss = 0.0
    for k, d in enumerate(data):  # one dense forward per datum: log-probs and entropy from it
        logits = client.model(input_ids=torch.tensor([d.model_input.to_ints()])).logits[0]
        logp_V = torch.log_softmax(logits.double(), -1)
        ent = -(logp_V.exp() * logp_V).sum(-1)
        assert torch.allclose(seen["ent"][k], ent.detach(), atol=1e-9)
        logp = logp_V.gather(-1, field(d, "target_tokens")[:, None])[:, 0]
        want_loss = want_loss + logp.sum() - 0.5 * ent.sum()
    want_loss.backward()  # (Llama's RMSNorm runs in float32: one backward, the same rounding)
    want = lora_grads(client)
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-9


def test_objective_uses_the_given_entropy_for_the_bonus():
    from searchr1.losses.config import Aggregation
    from searchr1.losses.objective import ObjectiveSpec, actor_objective

    spec = ObjectiveSpec("importance_sampling", {}, Aggregation.token_mean, 0.5, None, 1.0, 1)
    lp = torch.tensor([-1.0, -2.0, -3.0], dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([0.7, 0.1, 0.4], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 0.0])
    zeros = torch.zeros(3, dtype=torch.float64)
    loss, metrics = actor_objective(spec, [lp], [lp.detach()], [zeros], [mask], [0], ent_D=[ent])
    assert metrics["entropy"] == pytest.approx(0.4)  # (0.7 + 0.1) / 2 action tokens
    loss.backward()
    assert ent.grad.tolist() == pytest.approx([-0.25, -0.25, 0.0])  # −coef / 2 tokens


# ----------------------------------------------------------------------- 9. PPO GAE domain


def _verl_gae(rewards, values, response, gamma, lam):
    """core_algos.compute_gae_advantage_return + masked_whiten, literally, on one row."""
    adv, last = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        nxt = values[t + 1] if t < len(rewards) - 1 else 0.0
        last = rewards[t] + gamma * nxt - values[t] + gamma * lam * last
        adv[t] = last
    ret = adv + values
    m = response > 0
    mean = adv[m].mean()
    var = ((adv[m] - mean) ** 2).mean() * m.sum() / (m.sum() - 1)
    return (adv - mean) / np.sqrt(var + 1e-8), ret


def _stage(mask, values, reward, domain, gamma=1.0, lam=1.0):
    """The registered ppo_gae estimator on a one-datum step batch with these shifted rows."""
    from searchr1.advantages import ADVANTAGES
    from searchr1.batch.step_batch import build_step_batch
    from tests.helpers.step_batches import trajectory

    t = trajectory(range(len(mask) + 1), [0, *mask], [0.0] * (len(mask) + 1), reward=reward)
    batch = build_step_batch([t], [0], [0], [np.array([reward])], 1, 10**6)
    batch.set_rows("values_T", [np.asarray(values, float)])
    cfg = AdvantageConfig(name="ppo_gae", gamma=gamma, lam=lam, gae_domain=domain)
    out = ADVANTAGES.get("ppo_gae")(batch, cfg)
    assert out.value_mask_T.tolist() == gae_domains([np.asarray(mask, float)], domain)[0].tolist()
    return out.advantages_T, out.returns_T


MASK = [0, 0, 1, 1, 0, 0, 1]  # prompt 2, action 2, observation 2, action 1
VALUES = [0.0, 0.0, 0.5, 0.2, 0.1, 0.4, 0.3]


def test_gae_over_the_response_matches_the_official_numbers_by_hand():
    # γ = λ = 1, reward 1 on the last token: A_t = 1 − V_t on positions 2..6 = .5 .8 .9 .6 .7,
    # mean .7, unbiased var .1/4 = .025 → whitened (A − .7)/√(.025 + 1e-8); returns 1
    adv, ret = _stage(MASK, VALUES, 1.0, "response")
    s = np.sqrt(0.025 + 1e-8)
    assert adv.tolist() == pytest.approx([0, 0, -0.2 / s, 0.1 / s, 0.2 / s, -0.1 / s, 0.0], abs=1e-9)
    assert ret.tolist() == pytest.approx([0, 0, 1, 1, 1, 1, 1])


def test_gae_over_actions_only_is_ours_and_differs():
    # A on 2, 3, 6 = .5 .8 .7 (mean 2/3, var ((−1/6)² + (2/15)² + (1/30)²)·… ) — whitened over 3 tokens
    adv, ret = _stage(MASK, VALUES, 1.0, "action")
    a = np.array([0.5, 0.8, 0.7])
    want = (a - a.mean()) / np.sqrt(a.var(ddof=1) + 1e-8)
    assert [adv[i] for i in (2, 3, 6)] == pytest.approx(want.tolist())
    assert adv[4] == adv[5] == 0.0 and ret[4] == ret[5] == 0.0


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8)])
def test_gae_over_the_response_equals_verls_loop(gamma, lam):
    rewards = np.array([0, 0, 0, 0, 0, 0, 1.0])
    want_adv, want_ret = _verl_gae(rewards[2:], np.array(VALUES[2:]), np.ones(5), gamma, lam)
    adv, ret = _stage(MASK, VALUES, 1.0, "response", gamma, lam)
    assert adv[2:].tolist() == pytest.approx(want_adv.tolist())
    assert ret[2:].tolist() == pytest.approx(want_ret.tolist())


def test_the_critic_is_fitted_on_the_response():
    assert response_mask(np.array(MASK)).tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert gae_domains([np.array(MASK)], "action")[0].tolist() == MASK
    cfg = _compose(["experiment=paper_ppo"])
    assert cfg.advantage.gae_domain.value == "response"
    assert _compose(["experiment=paper_ppo_world"]).advantage.gae_domain.value == "response"


# ----------------------------------------------------------------------- 8. BM25 titles


def _observation(retriever, query):
    from searchr1.protocols.tags import format_passage

    docs = asyncio.run(retriever.search([query], 1))[0]
    return docs, format_passage(1, docs[0])


def test_bm25_over_a_corpus_file_shows_the_official_quoted_title(tmp_path):
    from searchr1.retrievers.bm25 import BM25Config, BM25Retriever

    rows = [{"id": "7", "contents": '"Hamlet (film)"\nHamlet is a 1948 film.\nSecond line.'},
            {"id": "8", "contents": '"Other"\nNothing in common here.'}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    retriever = BM25Retriever.from_config(BM25Config(corpus_path=str(path)), dataset=None)
    docs, line = _observation(retriever, "hamlet film 1948")
    assert docs[0].contents == rows[0]["contents"]
    assert line == 'Doc 1(Title: "Hamlet (film)") Hamlet is a 1948 film.\nSecond line.\n'
    off = BM25Retriever.from_config(BM25Config(corpus_path=str(path), verbatim_titles=False), dataset=None)
    assert _observation(off, "hamlet film 1948")[1] == "Doc 1(Title: Hamlet (film)) Hamlet is a 1948 film.\nSecond line.\n"


def test_bm25_over_hotpotqa_rows_equals_the_official_format():
    corpus = MINI / "corpus.jsonl"
    if not corpus.is_file():
        pytest.skip("../shared/data/hotpotqa_mini is not here")
    from searchr1.retrievers.bm25 import BM25Config, BM25Retriever

    rows = [json.loads(line) for line in corpus.read_text().splitlines()[:200] if line.strip()]
    retriever = BM25Retriever.from_config(BM25Config(corpus_path=str(corpus)), dataset=None)
    row = rows[0]
    title = row["contents"].split("\n")[0]
    docs, line = _observation(retriever, title.strip('"') + " " + row["contents"].split("\n")[1][:80])
    hit = next(r for r in rows + [json.loads(x) for x in corpus.read_text().splitlines()[200:] if x.strip()]
               if str(r["id"]) == docs[0].id)
    head, *rest = hit["contents"].split("\n")  # the official _passages2string split
    assert line == f"Doc 1(Title: {head}) {chr(10).join(rest)}\n"
    assert head.startswith('"') and line.startswith('Doc 1(Title: "')


def test_bm25_over_the_world_keeps_unquoted_titles():
    from searchr1.data.types import Passage
    from searchr1.retrievers.bm25 import BM25Config, BM25Retriever

    dataset = SimpleNamespace(corpus=[Passage(id="w1", contents='"Zarn"\nZarn is a river.'),
                                      Passage(id="w2", contents='"Mel"\nMel is a town.')])
    retriever = BM25Retriever.from_config(BM25Config(), dataset)
    docs, line = _observation(retriever, "zarn river")
    assert docs[0].contents is None and line == "Doc 1(Title: Zarn) Zarn is a river.\n"
