"""The slot sampler's decode step: per-slot device state, the step itself, and its row count.

A step is pure device work (the engine captures it as a CUDA graph): one token for every row
it computes — the whole pool in slot order, or the slots of an ``index`` (live slots padded
with idle ones), whose state is gathered and scattered back.
"""

from __future__ import annotations

import torch

from searchr1.engines.local.sampling.slot_model import forward_hidden, logits

COMPACT_MIN_ROWS = 8  # smallest compacted decode batch; then powers of two, then multiples of 64
#: decode only the live rows when their padded count is at most the pool / this: a compacted
#: step gathers each row's keys (read + write) before attending, ~3 passes over those rows
COMPACT_FRACTION = 3


class DecodeState:
    """Per-slot decode state on the device; captured graphs read and write these tensors."""

    def __init__(self, slots: int, window: int, eos: list[int], device) -> None:
        z = lambda dtype: torch.zeros(slots, dtype=dtype, device=device)  # noqa: E731
        self.last_tok, self.pos, self.out_len, self.max_new = (z(torch.int64) for _ in range(4))
        self.top_k, self.seed = z(torch.int64), z(torch.int64)
        self.temp, self.top_p = z(torch.float32), z(torch.float32)
        self.active = z(torch.bool)
        self.eos = torch.tensor(eos or [-1], dtype=torch.int64, device=device)
        self.ring_tok = torch.zeros((slots, window), dtype=torch.int64, device=device)
        self.ring_lp = torch.zeros((slots, window), dtype=torch.float32, device=device)
        self.col = torch.zeros(1, dtype=torch.int64, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.last_tok, self.pos, self.out_len, self.max_new, self.top_k, self.seed,
                self.temp, self.top_p, self.active, self.ring_tok, self.ring_lp, self.col]


def power_of_two(n: int, least: int = 1) -> int:
    """Smallest power of two ≥ ``max(n, least)`` (the sampler's shape buckets)."""
    p = 1
    while p < max(n, least):
        p *= 2
    return p


def attention_bucket(needed: int, max_len: int) -> int:
    """Smallest attention length ≥ ``needed`` from 128, 256, … capped at ``max_len`` (one graph
    variant per bucket)."""
    return min(power_of_two(needed, 128), max_len)


def compacted_rows(live: int, slots: int) -> int:
    """Rows of a compacted step for ``live`` live slots, or ``slots`` (the whole pool) when the
    padded count is more than a ``COMPACT_FRACTION`` of the pool."""
    rows = power_of_two(min(live, 64), COMPACT_MIN_ROWS) if live <= 64 else -(-live // 64) * 64
    return rows if rows * COMPACT_FRACTION <= slots else slots


def decode_step(st: DecodeState, weights, cache, length: int, filtered: bool, index: torch.Tensor | None,
                layer_fns, pick, vocab_limit: int, flex_mask=None) -> None:
    """One token for every row: the pool (``index`` None) or the slots in ``index``.

    Rows that are not live write their keys to the scratch column and keep their state; EOS and
    ``max_new`` stop a row on the device; the token and its log-prob go to column ``col`` of the
    ring buffers. ``flex_mask`` (a ``flex_decode.FlexDecodeMask``) attends block-sparsely.
    """
    max_len = cache.max_len
    take = (lambda t: t) if index is None else (lambda t: t[index])  # noqa: E731
    last_tok, active, out_len = take(st.last_tok), take(st.active), take(st.out_len)
    pos = take(st.pos).clamp(max=max_len)
    write = torch.where(active, pos, torch.full_like(pos, max_len))
    # rows that are not live read one key block, not their finished sequence's whole context
    block_mask = None if flex_mask is None else flex_mask.build(torch.where(active, pos, 0), length)
    hidden = forward_hidden(weights, cache, last_tok[:, None], pos[:, None], write[:, None], index, length,
                            layer_fns, block_mask)
    # top-k/top-p (and compacted) steps select eagerly (still captured in the graph): inductor
    # cannot lower the vocabulary-wide cumsum on every torch version
    tok, lp = pick(logits(weights, hidden[:, 0]), take(st.temp), take(st.top_k), take(st.top_p),
                   take(st.seed), out_len, filtered, vocab_limit)
    grow = active.long()
    new_active = active & ~(tok[:, None] == st.eos[None, :]).any(dim=-1) & (out_len + grow < take(st.max_new))
    new_last = torch.where(active, tok, last_tok)
    if index is None:
        st.ring_tok.index_copy_(1, st.col, tok[:, None])
        st.ring_lp.index_copy_(1, st.col, lp[:, None])
        st.last_tok.copy_(new_last)
        st.pos.add_(grow)
        st.out_len.add_(grow)
        st.active.copy_(new_active)
    else:
        col = st.col.expand(index.shape[0])
        st.ring_tok.index_put_((index, col), tok)
        st.ring_lp.index_put_((index, col), lp)
        st.last_tok.index_copy_(0, index, new_last)
        st.pos.index_add_(0, index, grow)
        st.out_len.index_add_(0, index, grow)
        st.active.index_copy_(0, index, new_active)
    st.col.add_(1)
