"""Target log-probs from hidden states, chunk by chunk: no [tokens, vocab] tensor of the batch.

The decoder (with its LoRA adapters, which peft injects into the decoder's own linear
layers) runs once and gives hidden states; the output projection, logsumexp and gather
then run over ``chunk`` positions at a time. ``ChunkedLabelLogprob`` is a custom autograd
Function that keeps only the hidden states, the head weight, the labels and one fp32
logsumexp per position for backward, and recomputes each chunk's logits there:

    ∂ log p(y_t) / ∂ z_t = onehot(y_t) − softmax(z_t),    z_t = W h_t

so peak memory is one chunk's [chunk, V] logits (plus its softmax) instead of the whole
micro-batch's. Backward visits only positions with a nonzero gradient (the loss mask's), the
others' contribution being exactly zero. Numerics follow the full-logits path exactly: logits
are computed in the compute dtype and cast to the loss dtype before the softmax, and the
gradient is cast back to the compute dtype before the matmuls, as autograd does through
``.to(dtype)``. The compute dtype is the forward's: autocast's when it ran under autocast (full
fine-tuning keeps fp32 master weights and computes in bf16). Autograd does not re-enter
autocast for a custom Function's backward, so the backward casts to it itself; before it did,
the fp32 masters made the head's three backward GEMMs fp32 ones.

``ChunkedLogprobEntropy`` adds the exact entropy of each position's distribution, for the
entropy bonus (verl's ``entropy_from_logits``), with one logsumexp and one weighted sum per
chunk, H = lse − Σ_v p_v z_v, and in backward

    ∂H / ∂z_t = −p_t ⊙ (log p_t + H_t)

so it too never holds more than one chunk's logits.

Supported heads: a plain bias-free linear ``lm_head`` (Llama, Qwen2, SmolLM2, tied or
not). Models that rescale or soft-cap logits are refused with a clear error.
"""

from __future__ import annotations

import torch

from searchr1.engines.local.training.padded import PaddedBatch
from searchr1.engines.local.training.packing import PackedBatch, use_packed_attention

DEFAULT_CHUNK = 4096  # positions per chunk on CUDA: 4096 × 49,152 fp32 logits ≈ 0.8 GB
# Peak bytes the head holds per element of one chunk's [C, V] logits, forward or backward: the
# fp32 logits (or log-probs) and one more fp32 tensor of that shape (the softmax, or the
# entropy's weights), each step of a chunk in place where it can be and freed before the next
# chunk's logits exist (8), plus the fp32 temporary torch.logsumexp allocates inside itself (4).
# The start-up memory estimate counts it (engines/local/memory.py); 2026-12-05, an H100 arm ran
# out of memory in this head when it kept the previous chunk's tensors alive (16 bytes).
HEAD_BYTES_PER_LOGIT = 12
CPU_LOGITS_BYTES = 64 * 2**20  # one chunk's [chunk, V] logits on CPU, whatever the vocabulary


def default_chunk(device: torch.device, vocab_size: int, dtype: torch.dtype) -> int:
    """Positions per chunk: ``DEFAULT_CHUNK`` on CUDA; on CPU those whose logits fit ``CPU_LOGITS_BYTES``.

    Host memory is the scarce resource on CPU and the head's matmul is already efficient at
    a few hundred rows, so the chunk is a byte budget there, not a position count.
    """
    if device.type == "cuda":
        return DEFAULT_CHUNK
    itemsize = torch.empty((), dtype=dtype).element_size()
    return max(1, CPU_LOGITS_BYTES // (vocab_size * itemsize))


def add_weight_grad(grad_VH: torch.Tensor, grad_CV: torch.Tensor, hidden_CH: torch.Tensor) -> None:
    """``grad_VH += grad_CVᵀ · hidden_CH``, accumulated in ``grad_VH``'s dtype (the loss dtype, fp32).

    The head's weight gradient under full fine-tuning. Its inputs are in the compute dtype
    (bf16 on a GPU), so casting them up first changes no value, but it turns the largest
    matmul of the backward (vocabulary × hidden × chunk) into an fp32 GEMM, about 15× slower
    than a bf16 one on an H200. On CUDA the GEMM runs in the inputs' dtype with an fp32 output
    (``torch.mm(..., out_dtype=)``: fp32 accumulation, as the cast path has); elsewhere, or on
    a torch without that overload, the inputs are cast.
    """
    if grad_CV.is_cuda and grad_CV.dtype != grad_VH.dtype and _MM_OUT_DTYPE[0]:
        try:
            grad_VH.add_(torch.mm(grad_CV.T, hidden_CH, out_dtype=grad_VH.dtype))
            return
        except (TypeError, RuntimeError):  # no mm.dtype overload for these dtypes in this torch
            _MM_OUT_DTYPE[0] = False
    grad_VH.add_(grad_CV.T.to(grad_VH.dtype) @ hidden_CH.to(grad_VH.dtype))


_MM_OUT_DTYPE = [True]  # cleared the first time torch refuses mm(..., out_dtype=)


class ChunkedLabelLogprob(torch.autograd.Function):
    """log softmax(W h_n)[y_n] for every row n of ``hidden_NH``, ``chunk`` rows at a time."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, labels_N, chunk: int, out_dtype: torch.dtype):  # type: ignore
        logp_N = hidden_NH.new_empty(hidden_NH.shape[0], dtype=out_dtype)
        lse_N = hidden_NH.new_empty(hidden_NH.shape[0], dtype=out_dtype)
        ctx.compute_dtype = hidden_NH.dtype
        for s in range(0, hidden_NH.shape[0], chunk):
            logits_CV = torch.nn.functional.linear(hidden_NH[s : s + chunk], weight_VH)
            ctx.compute_dtype = logits_CV.dtype  # autocast's, when the forward runs under it
            logits_CV = logits_CV.to(out_dtype)
            lse_N[s : s + chunk] = torch.logsumexp(logits_CV, dim=-1)
            picked = logits_CV.gather(-1, labels_N[s : s + chunk, None])[:, 0]
            logp_N[s : s + chunk] = picked - lse_N[s : s + chunk]
            del logits_CV
        ctx.save_for_backward(hidden_NH, weight_VH, labels_N, lse_N)
        ctx.chunk, ctx.out_dtype = chunk, out_dtype
        return logp_N

    @staticmethod
    def backward(ctx, grad_N):  # type: ignore[override]
        hidden_NH, weight_VH, labels_N, lse_N = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # positions with a zero gradient (off the loss mask) contribute exact zeros: skip them
        rows_R = grad_N.nonzero().squeeze(-1)
        grad_h = torch.zeros_like(hidden_NH) if want_h else None
        grad_w = torch.zeros_like(weight_VH, dtype=ctx.out_dtype) if want_w else None
        weight_c = weight_VH.to(ctx.compute_dtype)
        for s in range(0, rows_R.shape[0], ctx.chunk):
            r_C = rows_R[s : s + ctx.chunk]
            h_CH, g_C = hidden_NH[r_C].to(ctx.compute_dtype), grad_N[r_C].to(ctx.out_dtype)
            # softmax in place on the chunk's fp32 logits: one [C, V] fp32 tensor at a time
            grad_CV = (torch.nn.functional.linear(h_CH, weight_c).to(ctx.out_dtype)
                       .sub_(lse_N[r_C, None]).exp_().mul_(-g_C[:, None]))
            grad_CV.scatter_add_(-1, labels_N[r_C, None], g_C[:, None])
            grad_CV = grad_CV.to(ctx.compute_dtype)
            if want_h:
                grad_h[r_C] = (grad_CV @ weight_c).to(grad_h.dtype)  # type: ignore[index,union-attr]
            if want_w:
                add_weight_grad(grad_w, grad_CV, h_CH)  # type: ignore[arg-type]
            del grad_CV, h_CH  # before the next chunk's logits exist, not after
        return grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype), None, None, None


class ChunkedLogprobEntropy(torch.autograd.Function):
    """(log softmax(W h_n)[y_n], H(softmax(W h_n))) per row, ``chunk`` rows at a time."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, labels_N, chunk: int, out_dtype: torch.dtype):  # type: ignore
        n = hidden_NH.shape[0]
        logp_N, lse_N, ent_N = (hidden_NH.new_empty(n, dtype=out_dtype) for _ in range(3))
        ctx.compute_dtype = hidden_NH.dtype
        for s in range(0, n, chunk):
            logits_CV = torch.nn.functional.linear(hidden_NH[s : s + chunk], weight_VH)
            ctx.compute_dtype = logits_CV.dtype  # autocast's, when the forward runs under it
            logits_CV = logits_CV.to(out_dtype)
            lse_C = torch.logsumexp(logits_CV, dim=-1)
            lse_N[s : s + chunk] = lse_C
            logp_N[s : s + chunk] = logits_CV.gather(-1, labels_N[s : s + chunk, None])[:, 0] - lse_C
            probs_CV = (logits_CV - lse_C[:, None]).exp_()
            ent_N[s : s + chunk] = lse_C - probs_CV.mul_(logits_CV).sum(-1)
            del logits_CV, probs_CV
        ctx.save_for_backward(hidden_NH, weight_VH, labels_N, lse_N, ent_N)
        ctx.chunk, ctx.out_dtype = chunk, out_dtype
        return logp_N, ent_N

    @staticmethod
    def backward(ctx, grad_logp_N, grad_ent_N):  # type: ignore[override]
        hidden_NH, weight_VH, labels_N, lse_N, ent_N = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden_NH) if want_h else None
        grad_w = torch.zeros_like(weight_VH, dtype=ctx.out_dtype) if want_w else None
        zeros = torch.zeros_like(lse_N)
        g_lp_N = zeros if grad_logp_N is None else grad_logp_N.to(ctx.out_dtype)
        g_h_N = zeros if grad_ent_N is None else grad_ent_N.to(ctx.out_dtype)
        weight_c = weight_VH.to(ctx.compute_dtype)
        for s in range(0, hidden_NH.shape[0], ctx.chunk):
            sl = slice(s, s + ctx.chunk)
            h_CH, g_lp, g_h = hidden_NH[sl].to(ctx.compute_dtype), g_lp_N[sl, None], g_h_N[sl, None]
            logp_CV = torch.nn.functional.linear(h_CH, weight_c).to(ctx.out_dtype).sub_(lse_N[sl, None])
            weight_CV = (logp_CV + ent_N[sl, None]).mul_(g_h).add_(g_lp)
            grad_CV = logp_CV.exp_().mul_(weight_CV).neg_()  # in place: log p is not needed again
            del logp_CV, weight_CV
            grad_CV.scatter_add_(-1, labels_N[sl, None], g_lp)
            grad_CV = grad_CV.to(ctx.compute_dtype)
            if want_h:
                grad_h[sl] = (grad_CV @ weight_c).to(grad_h.dtype)  # type: ignore[index,union-attr]
            if want_w:
                add_weight_grad(grad_w, grad_CV, h_CH)  # type: ignore[arg-type]
            del grad_CV, h_CH
        return grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype), None, None, None


def label_logprobs_entropy(
    hidden_NH: torch.Tensor, weight_VH: torch.Tensor, labels_N: torch.Tensor,
    out_dtype: torch.dtype, chunk: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(label), exact entropy) per row in ``out_dtype``; labels must be valid ids."""
    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    return ChunkedLogprobEntropy.apply(hidden_NH, weight_VH, labels_N, chunk, out_dtype)


def _head(hidden_NH, weight_VH, labels_N, active_N, out_dtype, chunk: int, entropy: bool):
    """Log-probs (and, with ``entropy``, entropies) of the rows, 0 where inactive."""
    zero = lambda x: torch.where(active_N, x, torch.zeros_like(x))
    if entropy:
        logp_N, ent_N = label_logprobs_entropy(hidden_NH, weight_VH, labels_N, out_dtype, chunk)
        return zero(logp_N), zero(ent_N)
    return zero(label_logprobs(hidden_NH, weight_VH, labels_N, out_dtype, chunk))


def label_logprobs(
    hidden_NH: torch.Tensor, weight_VH: torch.Tensor, labels_N: torch.Tensor,
    out_dtype: torch.dtype, chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """log π(label) per row in ``out_dtype``; labels must be valid ids (clamp −100 first)."""
    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    return ChunkedLabelLogprob.apply(hidden_NH, weight_VH, labels_N, chunk, out_dtype)


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers causal LM inside a peft wrapper (or ``model`` itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def output_weight(lm: torch.nn.Module) -> torch.Tensor:
    """The vocabulary projection's weight [V, H]; refuses heads this module cannot chunk."""
    head = lm.get_output_embeddings()
    config = lm.config
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError(f"chunked log-probs need a bias-free linear lm_head, got {type(head).__name__}")
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, name, None) not in (None, 1.0):
            raise ValueError(f"chunked log-probs do not support {name}={getattr(config, name)}")
    return head.weight


def packed_logprobs(
    model: torch.nn.Module, batch: PackedBatch, out_dtype: torch.dtype, chunk: int = DEFAULT_CHUNK,
    entropy: bool = False,
):
    """log π(target) per label slot of a packed batch, [T] in ``out_dtype``; 0 where inactive
    (with ``entropy``: a pair, the exact entropy per slot second).

    Differentiable when grad is enabled (through the adapters, which live in the decoder).
    """
    lm = causal_lm(model)
    with use_packed_attention(lm):
        hidden_1TH = lm.get_decoder()(
            input_ids=batch.input_ids_1T, position_ids=batch.position_ids_1T, use_cache=False,
            cu_seq_lens_q=batch.cu_seqlens_N1, cu_seq_lens_k=batch.cu_seqlens_N1,
            max_length_q=batch.max_length, max_length_k=batch.max_length,
        ).last_hidden_state
    hidden_TH = hidden_1TH[0].index_select(0, batch.predictor_T)
    return _head(hidden_TH, output_weight(lm), batch.labels_T.clamp(min=0), batch.active_T,
                 out_dtype, chunk, entropy)


def padded_logprobs(
    model: torch.nn.Module, batch: PaddedBatch, auto_shift: bool, out_dtype: torch.dtype,
    chunk: int = DEFAULT_CHUNK, entropy: bool = False,
):
    """The same for a right-padded batch, flattened to [B·S]; 0 on padding and inactive labels."""
    lm = causal_lm(model)
    hidden_BSH = lm.get_decoder()(
        input_ids=batch.input_ids_BS, attention_mask=batch.attention_BS, use_cache=False
    ).last_hidden_state
    hidden_NH = hidden_BSH.flatten(0, 1)
    predictor_N = torch.arange(hidden_NH.shape[0], device=hidden_NH.device)
    if auto_shift:  # position i − 1 predicts label i; label 0 (inactive) reads a dummy position
        predictor_N = (predictor_N - 1).clamp(min=0)
    return _head(hidden_NH.index_select(0, predictor_N), output_weight(lm),
                 batch.targets_BS.flatten().clamp(min=0), batch.active_T, out_dtype, chunk, entropy)
