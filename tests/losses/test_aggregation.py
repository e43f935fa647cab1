"""Each loss.aggregation mode against a direct computation, the per-token and per-datum
encodings' equal gradients, and the actor objective's terms."""

import math

import pytest
import torch

from searchr1.losses.aggregation import aggregate, datum_weights, global_totals
from searchr1.losses.config import Aggregation, KLConfig
from searchr1.losses.objective import ObjectiveSpec, actor_objective, entropy_surrogate

F64 = torch.float64
# three trajectories: lengths 2, 3, 1 (domain: 2, 2, 1 tokens); micro-batches {0, 1}, {2}
VALS = [[1.0, 3.0], [2.0, 4.0, 100.0], [6.0]]
DOM = [[True, True], [True, True, False], [True]]
MICRO = [0, 0, 1]


def flat():
    v = torch.tensor([x for r in VALS for x in r], dtype=F64)
    d = torch.tensor([x for r in DOM for x in r])
    seq = torch.tensor([i for i, r in enumerate(VALS) for _ in r])
    micro = torch.tensor([MICRO[i] for i, r in enumerate(VALS) for _ in r])
    return v, d, seq, micro


def direct(mode: str, n_seq: float, n_micro: int) -> float:
    rows = [[x for x, keep in zip(r, d) if keep] for r, d in zip(VALS, DOM)]
    if mode == "token_mean":
        toks = [x for r in rows for x in r]
        return sum(toks) / len(toks)
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / len(r) for r in rows) / n_seq
    if mode == "seq_mean_token_sum":
        return sum(sum(r) for r in rows) / n_seq
    micro_rows = [[x for i, r in enumerate(rows) if MICRO[i] == m for x in r] for m in range(n_micro)]
    return sum(sum(r) / len(r) for r in micro_rows) / n_micro


@pytest.mark.parametrize("mode", [m.value for m in Aggregation])
@pytest.mark.parametrize("n_seq", [3.0, 5.0])
def test_each_mode_matches_a_direct_computation(mode, n_seq):
    v, d, seq, micro = flat()
    got = aggregate(v, d, mode, seq_T=seq, n_seq=n_seq, micro_T=micro, n_micro=2)
    assert float(got) == pytest.approx(direct(mode, n_seq, 2), rel=1e-12)


def test_modes_differ_and_masked_tokens_never_count():
    v, d, seq, micro = flat()
    vals = {m: float(aggregate(v, d, m, seq_T=seq, n_seq=3, micro_T=micro, n_micro=2)) for m in Aggregation}
    # hand values: token mean 16/5; seq mean of means (2 + 3 + 6)/3; seq of sums (4 + 6 + 6)/3;
    # micro-batch means (10/4 + 6)/2
    assert vals[Aggregation.token_mean] == pytest.approx(16 / 5)
    assert vals[Aggregation.seq_mean_token_mean] == pytest.approx(11 / 3)
    assert vals[Aggregation.seq_mean_token_sum] == pytest.approx(16 / 3)
    assert vals[Aggregation.microbatch_token_mean] == pytest.approx(4.25)


def test_seq_and_micro_modes_need_their_indices():
    v, d, _, _ = flat()
    with pytest.raises(ValueError, match="seq_T"):
        aggregate(v, d, Aggregation.seq_mean_token_mean)
    with pytest.raises(ValueError, match="micro_T"):
        aggregate(v, d, Aggregation.microbatch_token_mean)


#: eight datums with 1, 1, 1, 1, 2, 2, 4, 4 loss tokens (each after one masked position),
#: standing for 16 trajectories, in loss micro-batches of 2 datums (2, 2, 4, 8 tokens): every
#: count and total is a power of two, so both encodings scale each token's loss gradient by
#: the same power of two and are equal bit for bit, whatever the log-probs and advantages
LOSS_TOKENS = (1, 1, 1, 1, 2, 2, 4, 4)


@pytest.mark.parametrize("mode", list(Aggregation))
def test_per_token_and_per_datum_encodings_give_the_same_gradient(mode):
    """``aggregate`` (the custom objective's encoding) and ``datum_weights`` on the advantages
    under an engine's token mean over the call (the built-in losses') give exactly the same
    gradient of an importance-sampling loss (linear in A) in the log-probs."""
    domain_D = [torch.tensor([False] + [True] * n) for n in LOSS_TOKENS]
    tokens_D = [float(d.sum()) for d in domain_D]
    g = global_totals(tokens_D, micro_size=2, n_seq=16.0)
    assert (g.tokens, g.micro_tokens, g.n_micro) == (16.0, (2.0, 2.0, 4.0, 8.0), 4)
    w_D = datum_weights(mode, tokens_D, g)
    lengths = [len(d) for d in domain_D]
    domain_T = torch.cat(domain_D)
    seq_T = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
    micro_T = torch.cat([torch.full((n,), g.micro_of(d)) for d, n in enumerate(lengths)])
    w_T = torch.cat([torch.full((n,), w, dtype=F64) for w, n in zip(w_D, lengths)])
    gen = torch.Generator().manual_seed(0)
    logp_T = (-torch.rand(len(domain_T), generator=gen, dtype=F64)).requires_grad_(True)
    old_T = logp_T.detach() - 0.1 * torch.rand(len(domain_T), generator=gen, dtype=F64)
    adv_T = torch.randn(len(domain_T), generator=gen, dtype=F64)

    def is_loss(adv):  # importance_sampling, per token: −r·A
        return -torch.exp(logp_T - old_T) * adv

    per_token = aggregate(is_loss(adv_T), domain_T, mode, seq_T=seq_T, n_seq=g.n_seq, micro_T=micro_T,
                          n_micro=g.n_micro, tokens=g.tokens, micro_tokens=g.micro_tokens)
    per_datum = aggregate(is_loss(adv_T * w_T), domain_T, Aggregation.token_mean)  # the call's token mean
    (grad_token,) = torch.autograd.grad(per_token, logp_T)
    (grad_datum,) = torch.autograd.grad(per_datum, logp_T)
    assert torch.equal(grad_token, grad_datum)  # exact, not approximate
    assert bool((grad_token[~domain_T] == 0).all()) and bool((grad_token[domain_T] != 0).all())
    assert per_token.item() == pytest.approx(per_datum.item(), rel=1e-12)  # summed in another order


def test_entropy_surrogate_value_and_gradient():
    logp = torch.tensor([math.log(0.5), math.log(0.25)], dtype=F64, requires_grad=True)
    h = entropy_surrogate(logp)
    assert h.detach().tolist() == pytest.approx([math.log(2), math.log(4)])
    h.sum().backward()
    # d/dlogp of −½ logp² is −logp
    assert logp.grad.tolist() == pytest.approx([math.log(2), math.log(4)])


def test_objective_is_policy_minus_entropy_plus_kl_under_one_aggregation():
    torch.manual_seed(0)
    lens = [3, 2]
    logp = [(-torch.rand(n, dtype=F64)).requires_grad_(True) for n in lens]
    q = [x.detach() - 0.1 for x in logp]
    adv = [torch.tensor([1.0, 1.0, 0.0], dtype=F64), torch.tensor([-1.0, -1.0], dtype=F64)]
    mask = [torch.tensor([1.0, 1.0, 0.0], dtype=F64), torch.ones(2, dtype=F64)]
    ref = [x.detach() - 0.3 for x in logp]
    kl = KLConfig(coef=0.1, estimator="k1")
    spec = ObjectiveSpec("importance_sampling", {}, Aggregation.seq_mean_token_mean, 0.01, kl,
                         n_seq=2.0, n_micro=1)
    loss, metrics = actor_objective(spec, logp, q, adv, mask, [0, 0], ref)
    # direct: per trajectory token means of −r·A, entropy −logp, KL logp − ref
    def seq_mean(per_token):
        return sum((per_token[i] * mask[i]).sum() / mask[i].sum() for i in range(2)) / 2
    pg = seq_mean([-torch.exp(logp[i] - q[i]) * adv[i] for i in range(2)])
    ent = seq_mean([-logp[i] for i in range(2)])
    klv = seq_mean([logp[i] - ref[i] for i in range(2)])
    expected = pg - 0.01 * ent + 0.1 * klv
    assert float(loss) == pytest.approx(float(expected), rel=1e-10)
    assert metrics["kl"] == pytest.approx(0.3)
    assert metrics["ratio_mean"] == pytest.approx(math.exp(0.1))
