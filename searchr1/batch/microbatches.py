"""Packing datums into micro-batches: first-fit decreasing under two limits.

A micro-batch's cost is its padded size (longest datum × number of datums), as padded
forward passes pay it. Datums are taken longest first and each goes into the first open
micro-batch where it still fits (≤ ``max_datums`` datums and ≤ ``max_padded_tokens``);
otherwise a new one opens. Returned in bin order, the concatenation is what we hand to a
single ``forward_backward`` call. The local engine's sequential chunker uses the same
padded-cost limits and so cuts exactly these bins (a bin only grows after a later bin opens
and the padded cost is monotone). PyTRIO re-chunks on the server's limits, counting tokens
without padding, so its micro-batches may differ; the gradient does not, because every
chunk is normalised by the totals of the whole call.
"""

from __future__ import annotations


def pack_ffd(lengths: list[int], max_datums: int, max_padded_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into micro-batches (first-fit decreasing)."""
    if max_datums < 1 or max_padded_tokens < 1:
        raise ValueError("micro-batch limits must be positive")
    too_long = [n for n in lengths if n > max_padded_tokens]
    if too_long:
        raise ValueError(
            f"a datum of {max(too_long)} tokens exceeds max_padded_tokens_per_microbatch="
            f"{max_padded_tokens}; raise the limit or lower trainer.max_datum_tokens"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    widths: list[int] = []  # longest datum per bin (the first one placed)
    for i in order:
        for b, members in enumerate(bins):
            if len(members) < max_datums and widths[b] * (len(members) + 1) <= max_padded_tokens:
                members.append(i)
                break
        else:
            bins.append([i])
            widths.append(lengths[i])
    return bins


def padded_tokens(lengths: list[int], bins: list[list[int]]) -> int:
    """Total padded tokens of a packing (for metrics)."""
    return sum(max(lengths[i] for i in b) * len(b) for b in bins)

