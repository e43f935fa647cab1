"""Block-sparse decode attention (``engine.decode_attention=flex``) against the default kernel."""

from __future__ import annotations

import pytest
import torch

from searchr1.engines.local.sampling.flex_decode import BLOCK, FlexDecodeMask, flex_decode_attention
from searchr1.engines.local.sampling.slot_model import _grouped_attention


def test_each_row_reads_the_blocks_up_to_its_position_only():
    mask = FlexDecodeMask(4, "cpu")
    pos = torch.tensor([0, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
    bm = mask.build(pos, 4 * BLOCK)
    assert bm.kv_num_blocks.view(-1).tolist() == [1, 1, 2, 4]
    assert bm.seq_lengths == (1, 4 * BLOCK)
    dense = bm.to_dense() if hasattr(bm, "to_dense") else None
    if dense is not None:  # per-block view: row b's blocks past pos // BLOCK are skipped
        assert dense.view(4, -1).sum(-1).tolist() == [1, 1, 2, 4]
    # positions inside the last block beyond pos are masked by the mask function
    b = torch.arange(4)[:, None]
    kv = torch.arange(4 * BLOCK)[None, :]
    assert torch.equal(mask.mask_mod(b, 0, 0, kv), kv <= pos[:, None])


@pytest.mark.parametrize("length", [256, 300])
def test_flex_decode_equals_the_grouped_kernel_in_float32(length):
    g = torch.Generator().manual_seed(length)
    rows, heads, kv_heads, d = 5, 6, 2, 16
    q = torch.randn(rows, 1, heads, d, generator=g)
    k = torch.randn(rows, kv_heads, length, d, generator=g)
    v = torch.randn(rows, kv_heads, length, d, generator=g)
    pos = torch.tensor([0, 7, 127, 128, length - 1])
    allowed = torch.arange(length)[None, None, :] <= pos[:, None, None]
    want = _grouped_attention(q, k, v, allowed, d ** -0.5)
    got = flex_decode_attention(q, k, v, FlexDecodeMask(8, "cpu").build(pos, length), d ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # stale keys past a row's position change nothing
    k2 = k.clone()
    k2[0, :, 1:] = 1e3
    again = flex_decode_attention(q, k2, v, FlexDecodeMask(8, "cpu").build(pos, length), d ** -0.5)
    torch.testing.assert_close(again[0], got[0], rtol=1e-5, atol=1e-5)
