"""Block-sparse decode attention (``engine.decode_attention=flex``): each row reads its own context.

The default decode attention (``slot_model._grouped_attention``) reads every row's keys up to
the step's length bucket and materialises float32 scores; at long contexts that is several
times the bytes the rows need. With ``flex`` a decode step attends through
``torch.nn.attention.flex_attention`` with a ``BlockMask`` made on the device from the rows'
positions: row ``b`` reads only the key blocks ``0 … pos[b] // BLOCK`` and, inside the last one,
positions ``≤ pos[b]`` (the mask function). Everything lives in buffers the captured decode
graphs keep pointing at: ``FlexDecodeMask.build`` runs inside the step, so a replay rebuilds the
mask from the step's own positions; ``layer_post_flex`` is the decode layer's second half that
reads it. The engine imports this module only when the option is set (importing flex attention
takes over a second).

Numerics: flex accumulates in float32 like the default path's softmax, but it does not round
the scores to the weights' dtype first, so in bf16 the two differ by a few 1e-3 in the output;
in float32 they agree to rounding (tested on CPU).
"""

from __future__ import annotations

import inspect

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from searchr1.engines.local.sampling.slot_model import Dims, layer_post, layer_rest

BLOCK = 128  # key positions per block (flex's default block size)
_NO_Q_BLOCKS = "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters


class FlexDecodeMask:
    """The block mask of a decode step over ``rows`` rows, from a static position buffer."""

    def __init__(self, rows: int, device) -> None:
        self.pos = torch.zeros(rows, dtype=torch.int64, device=device)
        pos = self.pos

        def visible(b, h, q_idx, kv_idx):  # one function for every step: compiled code keeps it
            return kv_idx <= pos[b]

        self.mask_mod = visible

    def build(self, pos_B: torch.Tensor, length: int) -> BlockMask:
        """Mask for rows at positions ``pos_B`` (each attends ``[0, pos]``) over ``[0, length)``."""
        rows = pos_B.shape[0]
        self.pos[:rows].copy_(pos_B)
        blocks = -(-length // BLOCK)
        counts = (torch.div(pos_B, BLOCK, rounding_mode="floor") + 1).clamp(max=blocks)
        indices = torch.arange(blocks, device=pos_B.device, dtype=torch.int32).expand(rows, 1, 1, blocks)
        extra = {"compute_q_blocks": False} if _NO_Q_BLOCKS else {}
        return BlockMask.from_kv_blocks(counts.to(torch.int32).view(rows, 1, 1), indices.contiguous(),
                                        BLOCK_SIZE=BLOCK, mask_mod=self.mask_mod,
                                        seq_lengths=(1, length), **extra)


_compiled_flex = None


def _flex():
    """``flex_attention`` compiled on its own (a fused kernel) for callers outside compiled code."""
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_decode_attention(q_BTND, k_BKLD, v_BKLD, block_mask: BlockMask, scale: float) -> torch.Tensor:
    """One decode token per row through ``flex_attention`` with grouped KV heads: ``[B, 1, N·D]``.

    Inside compiled code (``engine.compile_decode``) or on CPU the call is plain; an eager CUDA
    caller gets the compiled kernel (eager flex materialises the whole score matrix)."""
    b, t, n, d = q_BTND.shape
    fused = q_BTND.device.type == "cuda" and not torch.compiler.is_compiling()
    out = (_flex() if fused else flex_attention)(q_BTND.transpose(1, 2), k_BKLD, v_BKLD,
                                                  block_mask=block_mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(b, t, n * d)


def layer_post_flex(x, q, keys, values, mask, o_w, post_norm, gate_up, down, d: Dims):
    """``slot_model.layer_post`` for a flex decode step: ``mask`` is its ``BlockMask`` (a boolean
    mask, for the prefill, goes to the default kernels)."""
    if not isinstance(mask, BlockMask):
        return layer_post(x, q, keys, values, mask, o_w, post_norm, gate_up, down, d)
    return layer_rest(x, flex_decode_attention(q, keys, values, mask, d.head_dim ** -0.5), o_w, post_norm,
                      gate_up, down, d)
