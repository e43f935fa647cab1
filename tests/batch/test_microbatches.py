"""Micro-batch packing and the LR schedule against hand-worked examples."""

import pytest

from searchr1.utils.lr_schedule import learning_rate
from searchr1.batch.microbatches import pack_ffd, padded_tokens


def test_ffd_hand_worked():
    lengths = [5, 9, 3, 8, 2]
    # sorted: 9(i1) 8(i3) 5(i0) 3(i2) 2(i4); limit 18 padded tokens, 3 datums
    # bin0 = [1] w9 → +8: 9*2=18 ok → [1,3]; +5: 9*3=27 no → bin1=[0] w5; +3: bin0 27 no, bin1 10 ok
    # +2: bin0 no, bin1 5*3=15 ok
    bins = pack_ffd(lengths, max_datums=3, max_padded_tokens=18)
    assert bins == [[1, 3], [0, 2, 4]]
    assert padded_tokens(lengths, bins) == 18 + 15


def test_ffd_respects_max_datums_and_rejects_too_long():
    assert pack_ffd([1, 1, 1, 1, 1], max_datums=2, max_padded_tokens=100) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="exceeds max_padded_tokens"):
        pack_ffd([10, 50], max_datums=4, max_padded_tokens=20)


def test_sequential_greedy_reproduces_ffd_bins():
    lengths = [7, 3, 12, 5, 5, 9, 1, 4, 11, 6]
    limit, k = 24, 3
    bins = pack_ffd(lengths, k, limit)
    flat = [lengths[i] for b in bins for i in b]
    chunks, cur = [], []
    for n in flat:  # the engines' sequential chunker
        if cur and (len(cur) + 1 > k or max(cur + [n]) * (len(cur) + 1) > limit):
            chunks.append(cur)
            cur = []
        cur.append(n)
    chunks.append(cur)
    assert chunks == [[lengths[i] for i in b] for b in bins]


def test_minibatch_split_and_lr():
    assert learning_rate("constant", 1e-3, 5, 10, 0.0) == 1e-3
    # warm-up over ceil(0.25·10)=3 steps: 1/3, 2/3, 1, 1 …
    lrs = [learning_rate("linear_warmup", 3e-3, s, 10, 0.25) for s in range(5)]
    assert lrs == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3, 3e-3])
    with pytest.raises(ValueError, match="valid: constant, linear_warmup"):
        learning_rate("cosine", 1.0, 0, 1, 0.0)
