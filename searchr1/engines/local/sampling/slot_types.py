"""The slot sampler's values: a sequence to sample, its weights' identity, a request, counters."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from searchr1.engines.local.sampling.select import RowSampling
    from searchr1.engines.local.sampling.slot_table import Placement
    from searchr1.engines.local.sampling.stops import StopRule


@dataclass
class SlotSeq:
    """One sequence to generate: a request with ``num_samples`` = n makes n of these."""

    prompt: np.ndarray  # int64 token ids
    sampling: RowSampling
    seed: int  # 63-bit
    stop: StopRule  # its ``max_tokens`` is already cut to what fits the slot
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None
    slot: int = -1
    placement: Placement | None = None

    @property
    def max_new(self) -> int:
        """Most tokens this sequence may generate (the device stops it there)."""
        return self.stop.max_tokens


@dataclass
class WeightsSource:
    """Where a request's weights come from: a model (peft, plain or adapters-off view)."""

    model: object
    version: object = lambda: 0  # callable; changes whenever the weights change
    lock: object | None = None  # held while folding (the trainer mutates the weights)

    def identity(self) -> tuple[int, object]:
        return id(self.model), self.version()


@dataclass
class SlotRequest:
    """One ``submit`` call: its sequences, their weights and the future that resolves it."""

    seqs: list[SlotSeq]
    source: WeightsSource
    future: Future
    pending: int


@dataclass
class Window:
    """A decode window queued on the device: when it was launched and the rows it decodes
    (slot → its sequence and request), the ones its read-back finishes."""

    start: float
    rows: list[tuple[int, tuple[SlotSeq, SlotRequest]]]


@dataclass
class SlotStats:
    """Work counters (read by tests and benchmarks)."""

    decode_steps: int = 0
    windows: int = 0
    live_row_steps: int = 0  # sum over decode steps of the live rows (÷ decode_steps: mean rows)
    decode_seconds: float = 0.0  # wall time in decode windows (steps + the transfer that reads them)
    admit_seconds: float = 0.0  # wall time in admission rounds (copies, prefill, arming)
    admissions: int = 0  # admission rounds that placed at least one sequence (one prefill each)
    admitted_behind: int = 0  # of those, rounds queued behind a decode window (admit_behind_window)
    compacted_windows: int = 0  # windows that decoded only the live rows (not the whole pool)
    prefill_tokens: int = 0  # prompt tokens computed by prefill
    prefill_chunks: int = 0  # forwards those tokens took (prefill.chunks)
    reused_tokens: int = 0  # prompt tokens whose KV was already in the slot
    copied_tokens: int = 0  # prompt tokens whose KV was copied from another slot
    sequences: int = 0
    folds: int = 0
    graphs: int = 0
    capture_seconds: float = 0.0  # decode and prefill graphs
    prefill_replays: int = 0  # prefill chunks run as a replayed CUDA graph (engine.prefill_graphs)
    sleeps: int = 0  # KV pool releases between phases
    wake_seconds: float = 0.0  # time spent allocating it again
