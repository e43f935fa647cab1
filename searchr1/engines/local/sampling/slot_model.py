"""A functional Llama-family decoder over a pool of KV-cache slots, for the slot sampler.

The sampler keeps its own plain copy of the model's weights (``SlotWeights``): q/k/v and
gate/up fused into one matrix each, LoRA deltas folded in (``fold``), so decoding runs plain
matmuls and a captured CUDA graph keeps pointing at the same buffers when the policy changes
(``fold`` copies in place). Supported: ``llama`` (SmolLM2), ``qwen2`` (q/k/v bias) and
``qwen3`` (q/k RMSNorm); anything else falls back to the HF decoder (``supports``).

The KV cache is ``[slots, kv_heads, max_len + 1, head_dim]`` per layer; column ``max_len`` is a
scratch column where rows that are not live write their (ignored) keys, so a decode step over
the whole pool (or over live and idle slots) never corrupts a resident slot. Every forward writes the new tokens' keys and
values first, then attends with the mask ``key_pos <= query_pos``: stale entries beyond a
slot's length are never read, so freeing or truncating a slot is pure host bookkeeping.

Numerics follow transformers' Llama code: RMSNorm in float32 cast back before the weight,
RoPE cos/sin from the model's own rotary module (so rope scaling variants match), softmax in
float32. Shapes: ``_B`` rows, ``_T`` new tokens per row, ``_L`` attended positions,
``_H`` hidden size, ``_D`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED = ("llama", "qwen2", "qwen3")


def supports(model) -> bool:
    """Whether ``model`` (HF, peft or the adapters-off view) has an architecture we decode."""
    base, _ = unwrap(model)
    return getattr(base.config, "model_type", None) in SUPPORTED


def unwrap(model) -> tuple[torch.nn.Module, bool]:
    """``(HF causal LM, adapters_on)`` behind a peft model or the adapters-off view."""
    if getattr(model, "searchr1_adapters_off", False):
        return unwrap(model.inner)[0], False
    if hasattr(model, "get_base_model"):
        return model.get_base_model(), True
    return model, False


def effective_weight(module: torch.nn.Module, adapters_on: bool) -> torch.Tensor:
    """A linear layer's weight with its active LoRA deltas added (peft ``LoraLayer`` or plain)."""
    base = getattr(module, "base_layer", module)
    weight = base.weight
    if adapters_on and hasattr(module, "lora_A") and not getattr(module, "disable_adapters", False):
        for name in module.active_adapters:
            if name in module.lora_A:
                weight = weight + module.get_delta_weight(name)
    return weight


def _bias(module: torch.nn.Module) -> torch.Tensor | None:
    return getattr(getattr(module, "base_layer", module), "bias", None)


@dataclass
class Dims:
    """Sizes of the decoder, read from the HF config."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float

    @classmethod
    def of(cls, config) -> "Dims":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                   head_dim, config.vocab_size, config.rms_norm_eps)


class SlotWeights:
    """Merged, fused weights of a Llama-family model; ``fold`` refreshes them in place."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype, max_len: int) -> None:
        base, _ = unwrap(model)
        self.dims = Dims.of(base.config)
        self.device, self.dtype = device, dtype
        self.tensors: dict[str, torch.Tensor] = {}
        for name, value in self._merged(model).items():
            self.tensors[name] = value.detach().to(device=device, dtype=dtype).clone()
        positions = torch.arange(max_len + 1, device=device)[None]
        probe = torch.zeros(1, device=device, dtype=dtype)
        rotary = base.model.rotary_emb.to(device)
        cos, sin = rotary(probe, positions)
        self.cos, self.sin = cos[0].to(dtype), sin[0].to(dtype)  # [max_len + 1, D]

    @torch.no_grad()
    def fold(self, model) -> None:
        """Copy ``model``'s current weights (LoRA deltas folded in) into the buffers, in place."""
        for name, value in self._merged(model).items():
            self.tensors[name].copy_(value)

    @torch.no_grad()
    def _merged(self, model) -> dict[str, torch.Tensor]:
        base, adapters_on = unwrap(model)
        lm = base.model
        out = {"embed": lm.embed_tokens.weight, "norm": lm.norm.weight,
               "lm_head": effective_weight(base.get_output_embeddings(), adapters_on)}
        for i, layer in enumerate(lm.layers):
            att, mlp = layer.self_attn, layer.mlp
            projections = (att.q_proj, att.k_proj, att.v_proj)
            out[f"{i}.qkv"] = torch.cat([effective_weight(m, adapters_on) for m in projections])
            if _bias(att.q_proj) is not None:
                out[f"{i}.qkv_bias"] = torch.cat([_bias(m) for m in projections])
            out[f"{i}.o"] = effective_weight(att.o_proj, adapters_on)
            out[f"{i}.gate_up"] = torch.cat(
                [effective_weight(mlp.gate_proj, adapters_on), effective_weight(mlp.up_proj, adapters_on)]
            )
            out[f"{i}.down"] = effective_weight(mlp.down_proj, adapters_on)
            out[f"{i}.in_norm"] = layer.input_layernorm.weight
            out[f"{i}.post_norm"] = layer.post_attention_layernorm.weight
            if hasattr(att, "q_norm"):
                out[f"{i}.q_norm"], out[f"{i}.k_norm"] = att.q_norm.weight, att.k_norm.weight
        return out


class KVCache:
    """Per-layer key and value pools ``[slots, kv_heads, max_len + 1, head_dim]``."""

    def __init__(self, dims: Dims, slots: int, max_len: int, device, dtype) -> None:
        shape = (slots, dims.kv_heads, max_len + 1, dims.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(dims.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(dims.layers)]
        self.slots, self.max_len = slots, max_len

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy positions ``[0, length)`` of slot ``src`` into slot ``dst``."""
        for pool in (*self.k, *self.v):
            pool[dst, :, :length] = pool[src, :, :length]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rope(x_BTND: torch.Tensor, cos_BTD: torch.Tensor, sin_BTD: torch.Tensor) -> torch.Tensor:
    half = x_BTND.shape[-1] // 2
    rotated = torch.cat((-x_BTND[..., half:], x_BTND[..., :half]), dim=-1)
    return x_BTND * cos_BTD[:, :, None] + rotated * sin_BTD[:, :, None]


def _grouped_attention(q_BTND, k_BKLD, v_BKLD, allowed_BTL, scale: float) -> torch.Tensor:
    """Attention with grouped KV heads, without materialising repeated keys (decode path)."""
    b, t, n, d = q_BTND.shape
    kv = k_BKLD.shape[1]
    g = n // kv
    q = q_BTND.view(b, t, kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    scores = torch.matmul(q, k_BKLD.transpose(-1, -2)).float() * scale  # [B, K, G*T, L]
    allowed = allowed_BTL[:, None, None].expand(b, 1, g, t, allowed_BTL.shape[-1])
    scores = scores.masked_fill(~allowed.reshape(b, 1, g * t, -1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1).to(v_BKLD.dtype), v_BKLD)  # [B, K, G*T, D]
    return out.view(b, kv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, n * d)


def _sdpa_attention(q_BTND, k_BKLD, v_BKLD, allowed_BTL, scale: float) -> torch.Tensor:
    """Attention for prefill chunks: heads expanded, one fused kernel with a boolean mask, or
    causal over the chunk's own keys where ``allowed_BTL`` is None (no mask: a fused causal kernel
    that reads the grouped keys and values as they are, ``enable_gqa``, with no expanded copy)."""
    b, t, n, d = q_BTND.shape
    if allowed_BTL is None:
        out = F.scaled_dot_product_attention(
            q_BTND.transpose(1, 2), k_BKLD, v_BKLD, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        g = n // k_BKLD.shape[1]
        k = k_BKLD.repeat_interleave(g, dim=1)
        v = v_BKLD.repeat_interleave(g, dim=1)
        out = F.scaled_dot_product_attention(q_BTND.transpose(1, 2), k, v, attn_mask=allowed_BTL[:, None], scale=scale)
    return out.transpose(1, 2).reshape(b, t, n * d)


def forward_hidden(
    w: SlotWeights,
    cache: KVCache,
    ids_BT: torch.Tensor,
    pos_BT: torch.Tensor,
    write_BT: torch.Tensor,
    slots_B: torch.Tensor | None,
    length: int,
    layer_fns: "LayerFns | None" = None,
    block_mask=None,
    causal: bool = False,
    kv_only: bool = False,
) -> torch.Tensor | None:
    """Run new tokens through the decoder, writing their KV; returns final-normed hidden ``[B, T, H]``.

    ``pos_BT`` are the tokens' positions (RoPE and causal mask); ``write_BT`` where their KV goes
    (``cache.max_len`` = the scratch column, for padding and rows that are not live);
    ``slots_B`` the rows' slots, or None when the batch is the whole pool in slot order (the
    decode step: no gather of keys). Attention reads positions ``[0, length)``. ``layer_fns``
    replaces the two halves of each layer (compiled versions for the decode step);
    ``block_mask`` (a decode step's ``BlockMask``, from ``flex_decode.FlexDecodeMask``) goes to
    the second half in place of the boolean mask (``flex_decode.layer_post_flex`` reads it).
    ``causal``: every row starts at position 0 (a prefill chunk of fresh prompts), so each token
    attends to this call's own keys up to itself: attention reads the new keys in place with a
    causal kernel, with no cache read and no mask (the same keys the mask would allow).
    ``kv_only`` (a prefill): only the keys and values are wanted, so the last layer stops after
    writing them (its attention and MLP feed nothing) and None is returned.
    """
    d, t = w.dims, w.tensors
    b, steps = ids_BT.shape
    fns = layer_fns or EAGER
    slot_BT = (torch.arange(cache.slots, device=ids_BT.device) if slots_B is None else slots_B)[:, None]
    slot_BT = slot_BT.expand(b, steps)
    cos, sin = w.cos[pos_BT], w.sin[pos_BT]
    allowed_BTL = None if causal else torch.arange(length, device=ids_BT.device)[None, None, :] <= pos_BT[:, :, None]
    x = F.embedding(ids_BT, t["embed"])
    for i in range(d.layers):
        q, k, v = fns.pre(x, t[f"{i}.in_norm"], t[f"{i}.qkv"], t.get(f"{i}.qkv_bias"),
                          t.get(f"{i}.q_norm"), t.get(f"{i}.k_norm"), cos, sin, d)
        cache.k[i][slot_BT, :, write_BT] = k
        cache.v[i][slot_BT, :, write_BT] = v
        if kv_only and i == d.layers - 1:
            return None
        if causal:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)
        elif slots_B is None:
            keys, values = cache.k[i][:, :, :length], cache.v[i][:, :, :length]
        else:
            keys, values = cache.k[i][slots_B, :, :length], cache.v[i][slots_B, :, :length]
        x = fns.post(x, q, keys, values, allowed_BTL if block_mask is None else block_mask, t[f"{i}.o"], t[f"{i}.post_norm"],
                     t[f"{i}.gate_up"], t[f"{i}.down"], d)
    return rms_norm(x, t["norm"], d.eps)


def layer_pre(x, in_norm, qkv_w, qkv_b, q_norm, k_norm, cos, sin, d: Dims):
    """Attention input of one layer: norm, fused q/k/v projection, (q/k norm), RoPE."""
    b, steps = x.shape[:2]
    nq, nkv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    qkv = F.linear(rms_norm(x, in_norm, d.eps), qkv_w, qkv_b)
    q = qkv[..., :nq].view(b, steps, d.heads, d.head_dim)
    k = qkv[..., nq : nq + nkv].view(b, steps, d.kv_heads, d.head_dim)
    v = qkv[..., nq + nkv :].view(b, steps, d.kv_heads, d.head_dim)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, d.eps), rms_norm(k, k_norm, d.eps)
    return _rope(q, cos, sin), _rope(k, cos, sin), v


def layer_post(x, q, keys, values, allowed_BTL, o_w, post_norm, gate_up, down, d: Dims):
    """Rest of one layer: attention over the cache, output projection, MLP, residuals."""
    attend = _grouped_attention if q.shape[1] == 1 and allowed_BTL is not None else _sdpa_attention
    return layer_rest(x, attend(q, keys, values, allowed_BTL, d.head_dim ** -0.5), o_w, post_norm, gate_up,
                      down, d)


def layer_rest(x, attn_BTE, o_w, post_norm, gate_up, down, d: Dims):
    """After attention: output projection, MLP, residuals."""
    x = x + F.linear(attn_BTE, o_w)
    gate, up = F.linear(rms_norm(x, post_norm, d.eps), gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down)


@dataclass(frozen=True)
class LayerFns:
    """The two halves of a decoder layer; the KV write sits between them (kept eager)."""

    pre: object
    post: object


EAGER = LayerFns(layer_pre, layer_post)


def compiled_layer_fns(dynamic: bool = False, post=layer_post) -> LayerFns:
    """``torch.compile``d halves: fixed shapes (``post`` recompiles once per attention length),
    or ``dynamic`` (one shape-generic compile for every row count and length); ``post`` may be
    another second half (``flex_decode.layer_post_flex``).

    Dynamo keeps compiled variants per function, across engines: a process with several pools
    (a benchmark) needs more than the default 8 variants.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return LayerFns(torch.compile(layer_pre, fullgraph=True, dynamic=dynamic),
                    torch.compile(post, fullgraph=True, dynamic=dynamic))


def logits(w: SlotWeights, hidden_BH: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits of final-normed hidden states."""
    return F.linear(hidden_BH, w.tensors["lm_head"])
