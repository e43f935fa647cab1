"""Padded micro-batches for the local trainer: padding, full-logits target logprobs, splits.

This is the reference layout (and what ``layout="padded"`` runs); the default is packed
(``packing.py``) with chunked log-probs (``logprobs.py``), which give the same numbers
without padding and without a [B, S, V] fp32 logits tensor.

Input is the samples of one chunk of pytrio's ``plan_training_batch`` (already validated).
Sequences are right-padded: with a causal model and an attention mask, the real positions
of a padded row see exactly what they would see alone, so micro-batching changes nothing
but memory.

Label alignment follows pytrio: with ``auto_shift=False`` the datum is already shifted and
``target_tokens[i]`` is predicted by the logits at position ``i``; with ``auto_shift=True``
the targets are the unshifted sequence, ``target_tokens[i]`` is predicted by position
``i − 1``, and the first label is dropped (pytrio's planner does not count it either).
A label of −100 is ignored. Ignored and dropped labels get logprob 0 in every output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pytrio.client.training_batch import CrossEntropyTrainingSample, TrainingSample

IGNORE_LABEL = -100


@dataclass(frozen=True)
class PaddedBatch:
    """One micro-batch as right-padded tensors of shape [B, S]."""

    input_ids_BS: torch.Tensor  # long; padding filled with token 0
    attention_BS: torch.Tensor  # long; 1 on real tokens
    targets_BS: torch.Tensor  # long; IGNORE_LABEL on padding
    active_BS: torch.Tensor  # bool; label counts (real, not −100, not the auto-shifted first)
    weights_BS: torch.Tensor  # float; cross-entropy weight (or 1.0) on active labels, else 0
    sampling_logprobs_BS: torch.Tensor | None  # float; policy losses only
    advantages_BS: torch.Tensor | None  # float; policy losses only
    lengths_B: tuple[int, ...]  # real length of each row

    @property
    def active_T(self) -> torch.Tensor:
        return self.active_BS.flatten()

    @property
    def weights_T(self) -> torch.Tensor:
        return self.weights_BS.flatten()

    @property
    def sampling_logprobs_T(self) -> torch.Tensor | None:
        return None if self.sampling_logprobs_BS is None else self.sampling_logprobs_BS.flatten()

    @property
    def advantages_T(self) -> torch.Tensor | None:
        return None if self.advantages_BS is None else self.advantages_BS.flatten()

    def rows(self, values_T: torch.Tensor, detach: bool = True) -> list[torch.Tensor]:
        """Split a flattened [B·S] tensor into each row's real positions (detached by default)."""
        values_BS = values_T.view(self.active_BS.shape)
        parts = [values_BS[row, :n] for row, n in enumerate(self.lengths_B)]
        return [v.detach() for v in parts] if detach else parts

    def scatter_rows(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """Inverse of ``rows``: per-row tensors → flattened [B·S], zeros on padding."""
        out_BS = torch.zeros_like(self.weights_BS)
        for row, values in enumerate(rows):
            out_BS[row, : len(values)] = values
        return out_BS.flatten()


def _row(values: Sequence[float] | Sequence[int], width: int, fill: float | int) -> list:
    return list(values) + [fill] * (width - len(values))


def pad_samples(
    samples: Sequence[TrainingSample], auto_shift: bool, device: torch.device, dtype: torch.dtype
) -> PaddedBatch:
    """Right-pad validated samples; ``dtype`` is the float dtype of weights and loss inputs."""
    lengths = tuple(s.input_length for s in samples)
    width = max(lengths)
    ids = [_row(s.model_input.to_ints(), width, 0) for s in samples]
    targets = [_row(s.target_tokens, width, IGNORE_LABEL) for s in samples]
    targets_BS = torch.tensor(targets, dtype=torch.long, device=device)
    active_BS = targets_BS != IGNORE_LABEL
    if auto_shift:
        active_BS[:, 0] = False
    is_ce = isinstance(samples[0], CrossEntropyTrainingSample)
    weights = [_row(s.weights, width, 0.0) if is_ce else [1.0] * width for s in samples]
    weights_BS = torch.tensor(weights, dtype=dtype, device=device) * active_BS
    sampling_BS = advantages_BS = None
    if not is_ce:
        sampling_BS = torch.tensor([_row(s.logprobs, width, 0.0) for s in samples], dtype=dtype, device=device)
        advantages_BS = torch.tensor([_row(s.advantages, width, 0.0) for s in samples], dtype=dtype, device=device)
    attention = [[1] * n + [0] * (width - n) for n in lengths]
    return PaddedBatch(
        input_ids_BS=torch.tensor(ids, dtype=torch.long, device=device),
        attention_BS=torch.tensor(attention, dtype=torch.long, device=device),
        targets_BS=targets_BS,
        active_BS=active_BS,
        weights_BS=weights_BS,
        sampling_logprobs_BS=sampling_BS,
        advantages_BS=advantages_BS,
        lengths_B=lengths,
    )


def target_logprobs(
    model: torch.nn.Module, batch: PaddedBatch, auto_shift: bool, dtype: torch.dtype
) -> torch.Tensor:
    """log π(target) per label position, [B, S] in ``dtype``; 0 where the label is inactive.

    Differentiable when grad is enabled. Uses gather − logsumexp rather than a full
    log_softmax, so no second [B, S, V] tensor is kept for backward.
    """
    logits_BSV = model(input_ids=batch.input_ids_BS, attention_mask=batch.attention_BS).logits
    logits_BSV = logits_BSV.to(dtype)
    labels_BS = batch.targets_BS
    if auto_shift:  # position i − 1 predicts label i; label 0 has no predictor
        logits_BSV, labels_BS = logits_BSV[:, :-1], labels_BS[:, 1:]
    picked_BS = logits_BSV.gather(-1, labels_BS.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    logp_BS = picked_BS - torch.logsumexp(logits_BSV, dim=-1)
    if auto_shift:
        logp_BS = torch.nn.functional.pad(logp_BS, (1, 0))
    return torch.where(batch.active_BS, logp_BS, torch.zeros_like(logp_BS))


def split_by_padded_tokens(
    samples: Sequence[TrainingSample], max_padded_tokens: int | None
) -> list[list[TrainingSample]]:
    """Split one pytrio chunk, in order, so that rows × longest row ≤ ``max_padded_tokens``.

    pytrio's planner caps *logical* tokens per chunk; padding can make a local forward
    larger than that. Splitting further never changes the gradient (the denominators are
    the logical batch's totals), only peak memory. A single over-long sample stays alone.
    """
    if max_padded_tokens is None:
        return [list(samples)]
    parts: list[list[TrainingSample]] = []
    current: list[TrainingSample] = []
    longest = 0
    for sample in samples:
        n = sample.input_length
        if current and (len(current) + 1) * max(longest, n) > max_padded_tokens:
            parts.append(current)
            current, longest = [], 0
        current.append(sample)
        longest = max(longest, n)
    if current:
        parts.append(current)
    return parts
