"""The shared seeded selection: hash values, batch independence, distributions, filters, devices."""

from __future__ import annotations

import pytest
import torch

from searchr1.engines.local.sampling.select import (
    RowSampling,
    filter_logits,
    row_tensors,
    select,
    uniforms,
    unit_interval,
)

M32 = 0xFFFFFFFF


def py_fmix32(h: int) -> int:
    """murmur3's 32-bit finaliser on Python ints (arbitrary precision: no wrap to model)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def py_uniform(seed: int, position: int, v: int) -> float:
    """The uniform of entry ``v``, written from the rule: key(seed, position) ^ mix(v) → 23 bits."""
    lo, hi = seed & M32, (seed >> 32) & M32
    key = py_fmix32(lo ^ py_fmix32((hi + position * 0x9E3779B1) & M32))
    key = py_fmix32((key + 0x6A09E667) & M32)
    h = py_fmix32(key ^ ((v * 0x27D4EB2F) & M32))
    return ((h >> 9) + 0.5) / 2**23


def test_uniforms_equal_an_integer_reference_for_63_bit_seeds():
    seeds = [0, 5, 2**32 + 7, 2**63 - 1, 0x0123456789ABCDEF]
    positions = [0, 1, 17, 4095, 123_456]
    got = uniforms(torch.tensor(seeds), torch.tensor(positions), 300)
    expected = [[py_uniform(s, p, v) for v in range(300)] for s, p in zip(seeds, positions)]
    assert got.tolist() == expected  # exact: 23 bits + 0.5 is representable in float32
    assert 0 < float(got.min()) and float(got.max()) < 1


def test_extreme_hashes_map_strictly_inside_the_unit_interval():
    """Hash 0 → 2**-24 and hash 2**32 - 1 → 1 - 2**-24: both Gumbel draws stay finite."""
    u = unit_interval(torch.tensor([0, 2**32 - 1, 2**31]))
    assert u.tolist() == [2**-24, 1 - 2**-24, 0.5 + 2**-24]
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def rows_and_args(n: int, vocab: int):
    """``n`` rows of mixed parameters (plain, greedy, top-k, top-p, both) with distinct seeds."""
    torch.manual_seed(0)
    logits = torch.randn(n, vocab) * 3
    kinds = [RowSampling(1.0), RowSampling(0.0), RowSampling(0.8, top_k=4),
             RowSampling(1.3, top_p=0.6), RowSampling(0.5, top_k=10, top_p=0.9)]
    params = [kinds[i % len(kinds)] for i in range(n)]
    seeds = [1000 + 7919 * i for i in range(n)]
    positions = torch.tensor([(3 * i) % 11 for i in range(n)])
    return logits, params, seeds, positions


def pick(logits, params, seeds, positions):
    knobs = row_tensors(params, seeds, logits.device)
    return select(logits, *knobs, positions, any(p.filtered for p in params))[0]


def test_a_rows_token_depends_only_on_its_seed_position_and_logits():
    """Alone, in the full batch, reversed, or among other rows: the same token per row."""
    logits, params, seeds, positions = rows_and_args(10, 64)
    together = pick(logits, params, seeds, positions)
    for i in range(10):
        alone = pick(logits[i : i + 1], params[i : i + 1], seeds[i : i + 1], positions[i : i + 1])
        assert int(alone) == int(together[i])
    order = torch.randperm(10, generator=torch.Generator().manual_seed(1))
    shuffled = pick(logits[order], [params[i] for i in order], [seeds[i] for i in order],
                    positions[order])
    assert torch.equal(shuffled, together[order])
    plain = [i for i, p in enumerate(params) if not p.filtered]  # no truncating row: no sort
    subset = pick(logits[plain], [params[i] for i in plain], [seeds[i] for i in plain],
                  positions[plain])
    assert torch.equal(subset, together[plain])


def test_the_draw_changes_with_seed_and_position():
    logits = torch.zeros(200, 50)  # uniform distribution: the draw is the uniforms' argmax
    same = [RowSampling(1.0)] * 200
    base = pick(logits, same, [9] * 200, torch.arange(200))
    assert len(set(base.tolist())) > 30  # positions give different draws
    other = pick(logits, same, [10] * 200, torch.arange(200))
    assert (other != base).float().mean() > 0.9


@pytest.mark.parametrize("params, kept", [
    (RowSampling(1.0), 5),
    (RowSampling(0.5), 5),
    (RowSampling(1.0, top_k=2), 2),
    (RowSampling(1.0, top_p=0.7), 2),  # p0 ≈ .56 < .7 ≤ p0 + p1
    (RowSampling(2.0, top_p=0.7), 3),  # flatter at T = 2: p0 + p1 ≈ .61 < .7 ≤ p0 + p1 + p2
])
def test_draws_follow_the_truncated_tempered_softmax(params, kept):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n = 40_000
    tokens = pick(logits.expand(n, -1), [params] * n, [77] * n, torch.arange(n))
    freq = torch.bincount(tokens, minlength=5).float() / n
    target = torch.softmax(logits[:kept] / params.temperature, -1)
    assert freq[:kept] == pytest.approx(target.tolist(), abs=0.01)  # ≈ 4 standard errors
    assert freq[kept:].sum() == 0


def test_greedy_topk1_and_tiny_topp_take_the_argmax_and_logprob_is_raw():
    logits = torch.randn(6, 50)
    params = [RowSampling(0.0), RowSampling(1.0, top_k=1), RowSampling(1.0, top_p=1e-6),
              RowSampling(0.5, top_k=1), RowSampling(0.0, top_k=3, top_p=0.5),
              RowSampling(2.0, top_p=1e-6)]
    knobs = row_tensors(params, range(6), "cpu")
    tokens, logprobs = select(logits, *knobs, torch.zeros(6, dtype=torch.long), True)
    assert torch.equal(tokens, logits.argmax(-1))
    raw = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, raw)


def test_filter_keeps_topk_and_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, torch.tensor([-1]), torch.tensor([0.7])).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filter_logits(logits, torch.tensor([3]), torch.tensor([1.0])).isfinite()
    assert kept.tolist() == [[True, True, True, False]]
    kept = filter_logits(logits, torch.tensor([2]), torch.tensor([0.4])).isfinite()
    assert kept.tolist() == [[True, False, False, False]]


def test_top_p_one_drops_nothing_even_when_the_cumsum_rounds_to_one():
    """An untruncated row in a truncating batch keeps its whole vocabulary (same draw as alone)."""
    logits = torch.tensor([[0.0, -30.0, -30.0, -40.0]])  # mass before the tail is 1.0 in float32
    probs = torch.softmax(logits, -1)
    assert float((probs.cumsum(-1) - probs)[0, -1]) >= 1.0
    assert filter_logits(logits, torch.tensor([-1]), torch.tensor([1.0])).isfinite().all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_draws_equal_cpu_draws():
    logits, params, seeds, positions = rows_and_args(16, 1000)
    on_cpu = pick(logits, params, seeds, positions)
    on_gpu = pick(logits.cuda(), params, seeds, positions.cuda())
    assert torch.equal(on_gpu.cpu(), on_cpu)
    u_cpu = uniforms(torch.tensor(seeds), positions, 1000)
    assert torch.equal(uniforms(torch.tensor(seeds).cuda(), positions.cuda(), 1000).cpu(), u_cpu)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, -1, 1.0), (1.0, -1, 1.0), (0.8, 50, 0.9)])
def test_vocab_limit_never_picks_padding_rows_and_keeps_full_table_logprobs(temperature, top_k, top_p):
    """Rows past the tokenizer get the largest logits; with the limit they are never picked."""
    torch.manual_seed(0)
    limit, vocab, rows = 40, 64, 256
    logits = torch.randn(rows, vocab)
    logits[:, limit:] += 6.0  # padding rows dominate: without the limit they win almost always
    knobs = row_tensors([RowSampling(temperature, top_k, top_p)] * rows, range(rows), "cpu")
    positions = torch.zeros(rows, dtype=torch.int64)
    filtered = RowSampling(temperature, top_k, top_p).filtered
    free, _ = select(logits, *knobs, positions, filtered)
    assert (free >= limit).float().mean() > 0.9
    tokens, logprobs = select(logits, *knobs, positions, filtered, vocab_limit=limit)
    assert int(tokens.max()) < limit
    expected = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-6)  # the trainer's full-table log-prob
    # the limited pick is the pick on the tokenizer's slice: same uniforms, same argmax
    sliced, _ = select(logits[:, :limit].contiguous(), *knobs, positions, filtered)
    assert torch.equal(tokens, sliced)
    # a limit at or past the table changes nothing
    same, _ = select(logits, *knobs, positions, filtered, vocab_limit=vocab)
    assert torch.equal(same, free)
