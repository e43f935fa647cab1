"""Packed micro-batches for the local trainer: sequences end to end in one row, no padding.

A micro-batch of N samples becomes one row of T = Σ Lᵢ tokens. ``position_ids`` restart at
0 for every sample (so rotary embeddings see each sample as if alone) and attention stays
inside each sample through ``packed_attention``, an attention function registered with
transformers' ``AttentionInterface`` under ``PACKED_ATTENTION`` and switched on only for
the duration of a packed forward (``use_packed_attention``). It reads the sample
boundaries from the ``cu_seq_lens_q`` / ``max_length_q`` keyword arguments, which
transformers passes untouched from the model call to every attention layer.

Why a function of our own: transformers 5 packs sequences for sdpa/eager by building a
dense block-diagonal [T, T] mask (4 GiB of booleans at T = 64k, and the attention then
runs over all T² pairs), and its varlen path needs the ``flash_attn`` package. Torch ships
a varlen flash/cuDNN kernel (``torch.nn.attention.varlen.varlen_attn``): on CUDA in
fp16/bf16 we call it; elsewhere (CPU, float32/64) attention alone scatters the samples
into right-padded rows for one causal ``scaled_dot_product_attention`` call (exact; the
linear layers, most of the work, still see no padding).

Every sample's labels are laid out in the same order as its tokens (label slot k of the
batch belongs to the token at index k). ``predictor_T`` gives, for each label slot, the
packed position whose hidden state predicts it: the same position without ``auto_shift``,
the previous one with it (the first label of each sample then has none; it is inactive
and its index is a harmless 0). See ``batching.py`` for the label conventions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from pytrio.client.training_batch import CrossEntropyTrainingSample, TrainingSample
from transformers import AttentionInterface

from searchr1.engines.local.training.padded import IGNORE_LABEL

PACKED_ATTENTION = "searchr1_packed"
_VARLEN_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class PackedBatch:
    """One micro-batch packed into a single row; every ``*_T`` tensor has one entry per label."""

    input_ids_1T: torch.Tensor  # long
    position_ids_1T: torch.Tensor  # long; restarts at 0 for every sample
    cu_seqlens_N1: torch.Tensor  # int32 [N + 1]; sample i is tokens cu[i]:cu[i+1]
    max_length: int  # longest sample
    predictor_T: torch.Tensor  # long; packed position whose hidden state predicts this label
    labels_T: torch.Tensor  # long; the target token, IGNORE_LABEL where ignored
    active_T: torch.Tensor  # bool; label counts (not −100, not the auto-shifted first)
    weights_T: torch.Tensor  # float; cross-entropy weight (or 1.0) on active labels, else 0
    sampling_logprobs_T: torch.Tensor | None  # float; policy losses only
    advantages_T: torch.Tensor | None  # float; policy losses only
    lengths_B: tuple[int, ...]  # real length of each sample

    def rows(self, values_T: torch.Tensor, detach: bool = True) -> list[torch.Tensor]:
        """Split a per-label tensor back into one tensor per sample (detached by default)."""
        parts = values_T.split(list(self.lengths_B))
        return [v.detach() for v in parts] if detach else list(parts)

    def scatter_rows(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """Inverse of ``rows``: per-sample tensors → one per-label tensor."""
        return torch.cat([r.to(self.weights_T) for r in rows])


def pack_samples(
    samples: Sequence[TrainingSample], auto_shift: bool, device: torch.device, dtype: torch.dtype
) -> PackedBatch:
    """Pack validated samples end to end; ``dtype`` is the float dtype of the loss inputs."""
    lengths = tuple(s.input_length for s in samples)
    starts = torch.tensor((0, *lengths), dtype=torch.long).cumsum(0)
    positions = torch.cat([torch.arange(n) for n in lengths])
    predictor = starts[:-1].repeat_interleave(torch.tensor(lengths)) + positions
    labels = torch.tensor([t for s in samples for t in s.target_tokens], dtype=torch.long)
    active = labels != IGNORE_LABEL
    if auto_shift:  # position i − 1 predicts label i; the first label has no predictor
        predictor = (predictor - 1).clamp(min=0)
        active[starts[:-1]] = False
    is_ce = isinstance(samples[0], CrossEntropyTrainingSample)

    def floats(name: str) -> torch.Tensor:
        return torch.tensor([x for s in samples for x in getattr(s, name)], dtype=dtype, device=device)

    weights = floats("weights") if is_ce else torch.ones(len(labels), dtype=dtype, device=device)
    return PackedBatch(
        input_ids_1T=torch.tensor([[t for s in samples for t in s.model_input.to_ints()]], device=device),
        position_ids_1T=positions.unsqueeze(0).to(device),
        cu_seqlens_N1=starts.to(device=device, dtype=torch.int32),
        max_length=max(lengths),
        predictor_T=predictor.to(device),
        labels_T=labels.to(device),
        active_T=active.to(device),
        weights_T=weights * active.to(device),
        sampling_logprobs_T=None if is_ce else floats("logprobs"),
        advantages_T=None if is_ce else floats("advantages"),
        lengths_B=lengths,
    )


def split_by_tokens(samples: Sequence[TrainingSample], max_tokens: int | None) -> list[list[TrainingSample]]:
    """Split samples, in order, into runs of at most ``max_tokens`` tokens (an over-long one alone)."""
    if max_tokens is None:
        return [list(samples)]
    parts: list[list[TrainingSample]] = [[]]
    total = 0
    for sample in samples:
        if parts[-1] and total + sample.input_length > max_tokens:
            parts.append([])
            total = 0
        parts[-1].append(sample)
        total += sample.input_length
    return parts if parts[0] else []


@contextlib.contextmanager
def use_packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Switch ``model``'s attention to ``packed_attention`` for the duration of the block.

    Callers hold the model lock, so no other forward (the sampler's) runs meanwhile. With
    an implementation transformers has no mask function for, no mask is built at all.
    """
    config = model.config
    previous = config._attn_implementation_internal
    config._attn_implementation_internal = PACKED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation_internal = previous


def packed_attention(
    module: torch.nn.Module,
    query_1HTD: torch.Tensor,
    key_1KTD: torch.Tensor,
    value_1KTD: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed sample; returns [1, T, H, D] like transformers' kernels."""
    cu_N1 = kwargs.get("cu_seq_lens_q")
    if cu_N1 is None or attention_mask is not None or query_1HTD.shape[0] != 1:
        raise ValueError("packed attention needs one packed row, no mask, and cu_seq_lens_q / max_length_q")
    if dropout or kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("packed attention supports neither dropout, sliding windows nor soft-capping")
    if query_1HTD.is_cuda and query_1HTD.dtype in _VARLEN_DTYPES:
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query_1HTD, key_1KTD, value_1KTD))  # [T, H, D]
        if k.shape[1] != q.shape[1]:  # grouped KV heads: varlen_attn takes equal head counts
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        longest = int(kwargs["max_length_q"])  # type: ignore[arg-type]
        out_THD = varlen_attn(
            q, k, v, cu_N1, cu_N1, longest, longest, scale=scaling, window_size=(-1, 0),
        )
        return out_THD.unsqueeze(0), None
    longest = kwargs.get("max_length_q")  # a Python int: no device sync, no graph break when compiled
    out_1THD = _padded_causal_attention(query_1HTD, key_1KTD, value_1KTD, cu_N1, scaling,  # type: ignore[arg-type]
                                        int(longest) if longest is not None else None)  # type: ignore[arg-type]
    return out_1THD, None


def _padded_causal_attention(
    query_1HTD: torch.Tensor, key_1KTD: torch.Tensor, value_1KTD: torch.Tensor,
    cu_N1: torch.Tensor, scaling: float | None, longest: int | None = None,
) -> torch.Tensor:
    """Exact fallback: scatter the samples into right-padded rows for one causal sdpa call.

    Only attention sees the padding (the linear layers stay packed). With right padding a
    causal mask alone keeps every real query off the padding, which sits after it.
    """
    sizes_N = cu_N1.diff().long()
    total = query_1HTD.shape[2]  # known sizes keep the layer one graph when compiled
    row_T = torch.repeat_interleave(torch.arange(len(sizes_N), device=cu_N1.device), sizes_N, output_size=total)
    col_T = torch.arange(row_T.numel(), device=cu_N1.device) - cu_N1.long()[row_T]
    width = longest if longest is not None else int(sizes_N.max())

    def to_rows(x_1HTD: torch.Tensor) -> torch.Tensor:
        x_THD = x_1HTD[0].transpose(0, 1)
        rows_NLHD = x_THD.new_zeros(len(sizes_N), width, *x_THD.shape[1:])
        return rows_NLHD.index_put((row_T, col_T), x_THD).transpose(1, 2)  # [N, H, L, D]

    out_NHLD = torch.nn.functional.scaled_dot_product_attention(
        to_rows(query_1HTD), to_rows(key_1KTD), to_rows(value_1KTD), is_causal=True, scale=scaling,
        enable_gqa=query_1HTD.shape[1] != key_1KTD.shape[1],
    )
    return out_NHLD.transpose(1, 2)[row_T, col_T].unsqueeze(0)  # [1, T, H, D]


AttentionInterface.register(PACKED_ATTENTION, packed_attention)
