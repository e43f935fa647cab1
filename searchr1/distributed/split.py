"""Work → ranks: a step's questions by whole groups, eval questions, and global mini-batches.

A question is one group (its ``group_size`` trajectories are sampled, rewarded and get their
group advantage on the rank that holds the question), so splitting questions is splitting
by whole groups. Rank r takes a contiguous block, so concatenating the ranks' datums in rank
order gives the one-process datum order, and mini-batches cut from that global order
(``global_minibatches``) hold exactly the datums a one-process run would put in them — the
condition for the update to equal the one-process update (``docs/distributed.md``).
"""

from __future__ import annotations

from dataclasses import dataclass


def rank_block(n: int, world: int, rank: int) -> range:
    """Indices of rank ``rank``'s share of ``n`` items: contiguous, sizes differ by ≤ 1.

    Earlier ranks take the extra items, so the blocks in rank order are 0…n−1.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def split_questions(examples: list, world: int, rank: int) -> list:
    """This rank's questions of a step (whole groups); ``check_split`` made it even."""
    return [examples[i] for i in rank_block(len(examples), world, rank)]


def check_split(questions_per_step: int, world: int) -> str | None:
    """Why ``questions_per_step`` cannot be split into equal whole groups per rank, or None.

    Equal shares keep every rank's rollout the same size (no rank waits on a larger one)
    and make plain means of per-rank trajectory means the global means.
    """
    if world <= 1 or questions_per_step % world == 0:
        return None
    lower = questions_per_step - questions_per_step % world
    return (f"trainer.questions_per_step={questions_per_step} cannot be split into whole groups "
            f"over {world} processes: each rank must hold the same number of questions (one "
            f"question = one group). Use trainer.questions_per_step={lower or world} or "
            f"{lower + world}, or launch a process count that divides {questions_per_step}.")


@dataclass(frozen=True)
class MinibatchShare:
    """This rank's part of one global mini-batch."""

    local: list[int]  # this rank's datum indices in the mini-batch (may be empty)
    offset: int  # position of ``local[0]`` within the global mini-batch
    size: int  # datums of the global mini-batch, all ranks together


def global_minibatches(counts: list[int], rank: int, size: int) -> list[MinibatchShare]:
    """Contiguous mini-batches of ``size`` datums over the ranks' datums in rank order.

    ``counts[r]`` is rank r's datum count; ``size`` 0 = one mini-batch of everything. Every
    rank gets the same number of shares (the optimizer steps stay in lockstep), some empty.
    """
    if size < 0:
        raise ValueError("trainer.minibatch_trajectories must be >= 0")
    total = sum(counts)
    size = size or total or 1
    first = sum(counts[:rank])
    mine = range(first, first + counts[rank])
    out = []
    for start in range(0, total, size):
        stop = min(start + size, total)
        lo, hi = max(start, mine.start), min(stop, mine.stop)
        local = [g - first for g in range(lo, hi)]
        out.append(MinibatchShare(local, (lo - start) if local else 0, stop - start))
    return out
