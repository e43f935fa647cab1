"""Host-side bookkeeping of the slot sampler's KV pool: what each slot holds, who uses it.

Each slot mirrors, as token ids, the prefix whose keys and values are valid in the device
cache (``tokens[s, :kv_len[s]]``). A new request looks for the slot sharing the longest
prefix with its prompt (one vectorised comparison over the pool) and then either

- **extends** that slot in place, when the slot is idle and the prompt continues everything
  it holds (a trajectory's next turn: only the appended observation is prefilled), or
- **rewinds** that slot in place, when the slot is idle and the prompt continues the slot's
  last prompt and at least the first token of its output, then leaves the output part-way (a
  turn whose tail the rollout rewrote, as the scripted policy does): the valid prefix stays, the
  rest is overwritten, and the trajectory keeps its slot with nothing copied. A prompt that
  diverges inside the slot's prompt (another question sharing the template, a sibling sample)
  never rewinds a slot — that slot may be a trajectory waiting for its observation — or
- takes the least recently used idle slot and **copies** the shared prefix into it (the
  group's other samples, or another question sharing the instruction template).

Slots in use by a decoding sequence are never evicted; idle slots keep their contents until
the LRU rule hands them to someone else. All of this is pure numpy: the engine applies the
resulting copies and prefills on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_COPY = 16  # shorter shared prefixes are recomputed rather than copied


@dataclass(frozen=True)
class Placement:
    """Where a sequence goes: its slot, how many prompt tokens are already there, copy source."""

    slot: int
    reused: int  # prompt tokens whose KV is valid in ``slot`` once ``copy_from`` is applied
    copy_from: int | None = None  # slot to copy positions [0, reused) from
    after_prefill: bool = False  # copy once this round's prefills ran (a sibling sample's prompt)


class SlotTable:
    """Token mirror, lengths, busy flags and LRU clock of ``slots`` slots of ``max_len`` tokens."""

    def __init__(self, slots: int, max_len: int) -> None:
        self.tokens = np.zeros((slots, max_len), dtype=np.int64)
        self.kv_len = np.zeros(slots, dtype=np.int64)
        self.busy = np.zeros(slots, dtype=bool)
        self.last_used = np.zeros(slots, dtype=np.int64)
        self.prompt_len = np.zeros(slots, dtype=np.int64)  # the last sequence's prompt; its output follows
        self._clock = 0
        self.evicted_tokens = 0  # valid KV tokens thrown away by LRU reuse (for stats)

    @property
    def slots(self) -> int:
        return len(self.kv_len)

    def invalidate(self) -> None:
        """Forget every slot's contents (the weights changed, so the cached KV is stale)."""
        self.kv_len[:] = 0

    def shared_prefix(self, prompt: np.ndarray, cap: int, exclude: np.ndarray) -> tuple[int, int]:
        """``(slot, length)`` of the longest valid prefix of ``prompt[:cap]`` held by a slot.

        ``exclude`` marks slots that must not serve as a source (their contents are changing
        in this admission round). Returns ``(-1, 0)`` when nothing matches.
        """
        cap = min(cap, self.tokens.shape[1])
        if cap <= 0:
            return -1, 0
        equal = self.tokens[:, :cap] == prompt[None, :cap]
        first_diff = np.where(equal.all(axis=1), cap, (~equal).argmax(axis=1))
        shared = np.minimum(first_diff, self.kv_len)
        shared[exclude] = 0
        slot = int(shared.argmax())
        return (slot, int(shared[slot])) if shared[slot] > 0 else (-1, 0)

    def place(self, prompt: np.ndarray, reserved: np.ndarray) -> Placement | None:
        """Choose a slot for a sequence whose prompt is ``prompt``; None when all are busy.

        The prompt's last token is always fed by the decode step (it yields the first
        sampled token's logits), so at most ``len(prompt) - 1`` tokens are reused.
        """
        taken = self.busy | reserved
        source, shared = self.shared_prefix(prompt, len(prompt) - 1, reserved)
        if source >= 0 and not taken[source]:
            if shared == self.kv_len[source]:
                return Placement(source, shared)  # extend in place: the prompt continues this slot
            if shared > self.prompt_len[source]:  # rewind in place: it diverges inside the output
                self.evicted_tokens += int(self.kv_len[source]) - shared
                return Placement(source, shared)
        slot = self._lru_idle(taken)
        if slot < 0:
            return None
        self.evicted_tokens += int(self.kv_len[slot])
        if source == slot:
            return Placement(slot, shared)
        if shared >= MIN_COPY:
            return Placement(slot, shared, copy_from=source)
        return Placement(slot, 0)

    def place_sibling(self, primary: int, prompt: np.ndarray, reserved: np.ndarray) -> Placement | None:
        """A further sample of a prompt placed in ``primary`` this round: copy its KV once filled."""
        slot = self._lru_idle(self.busy | reserved)
        if slot < 0:
            return None
        self.evicted_tokens += int(self.kv_len[slot])
        return Placement(slot, len(prompt) - 1, copy_from=primary, after_prefill=True)

    def _lru_idle(self, taken: np.ndarray) -> int:
        """The idle slot used least recently (empty slots first); -1 when none is idle."""
        order = np.lexsort((self.last_used, self.kv_len > 0))
        for slot in order:
            if not taken[slot]:
                return int(slot)
        return -1

    def occupy(self, slot: int, prompt: np.ndarray) -> None:
        """A sequence starts decoding in ``slot``; its prompt minus the last token is cached."""
        n = len(prompt) - 1
        self.tokens[slot, :n] = prompt[:n]
        self.kv_len[slot] = n
        self.prompt_len[slot] = len(prompt)
        self.busy[slot] = True
        self._touch(slot)

    def release(self, slot: int, prompt: np.ndarray, generated: list[int]) -> None:
        """The sequence in ``slot`` finished: its prompt and all but its last token are cached."""
        held = np.concatenate([prompt, np.asarray(generated[:-1], dtype=np.int64)])
        n = min(len(held), self.tokens.shape[1])
        self.tokens[slot, :n] = held[:n]
        self.kv_len[slot] = n
        self.busy[slot] = False
        self._touch(slot)

    def _touch(self, slot: int) -> None:
        self._clock += 1
        self.last_used[slot] = self._clock
