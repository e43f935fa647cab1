"""When a generated sequence ends: one rule for both samplers (EOS, stop ids, stop strings, length).

The HF batched decode checks after every token, the slot sampler after a window of tokens read
back from the device; both call ``StopRule.check`` with the tokens added since the last check,
and get back the same answer a token-by-token check would give: the earliest position where

- the token is a stop id (EOS ids are always among them), or
- a stop string has just been completed (the completing token is kept), both reason "stop", or
- the sequence reached ``max_tokens``, reason "length" (a stop on that same token wins).

Stop strings are matched on the decoded text (special tokens kept) of the last few tokens —
enough for the longest stop string even at one byte per token — so a check costs O(window)
rather than re-decoding the whole generation. A window of new tokens is first decoded once; only
when a stop string shows up in it is the earliest completing token looked for one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

STOP = "stop"  # a stop token, a stop string or EOS ended the sequence
LENGTH = "length"  # the sequence reached max_tokens


class Ending(NamedTuple):
    """Where a sequence ends: how many generated tokens it keeps, and why."""

    length: int
    reason: str


@dataclass(frozen=True)
class StopRule:
    """Stop ids (EOS included), stop strings with the decoder that reads them, and the length cap."""

    token_ids: frozenset[int] = frozenset()
    strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None
    max_tokens: int | None = None  # None: no cap

    def capped(self, max_tokens: int) -> StopRule:
        """The same rule with ``max_tokens`` as its length cap."""
        return replace(self, max_tokens=max_tokens)

    def check(self, tokens: list[int], new: int = 1) -> Ending | None:
        """How the generation ``tokens`` ends, looking only at its last ``new`` tokens; None if not.

        Earlier tokens were already checked (and did not end it), so a window costs one scan.
        """
        start = len(tokens) - new
        limit = len(tokens) if self.max_tokens is None else min(len(tokens), self.max_tokens)
        ending = None
        if self.max_tokens is not None and limit == self.max_tokens:
            ending = Ending(limit, LENGTH)
        for j in range(start, limit):
            if tokens[j] in self.token_ids:
                ending, limit = Ending(j + 1, STOP), j + 1
                break
        found = self._string_end(tokens, start, limit)
        return Ending(found, STOP) if found is not None else ending

    def check_finished(self, tokens: list[int]) -> Ending | None:
        """How a generation that an engine stopping on the same ids and strings returned ends under
        this rule (vLLM's): stop ids and the cap over every token, stop strings in the tail only —
        the engine ended it at the first string it completed, so no earlier one is looked for."""
        ending = replace(self, strings=()).check(tokens, len(tokens))
        limit = ending.length if ending is not None else len(tokens)
        if not self.strings or self.decode is None:
            return ending
        found = self._string_end(tokens, max(0, limit - self._window()), limit)
        return Ending(found, STOP) if found is not None else ending

    def _window(self) -> int:
        """Tokens whose decoded text surely holds the longest stop string (≥ 1 byte per token)."""
        return 4 * max(len(s) for s in self.strings) + 4

    def _string_end(self, tokens: list[int], start: int, end: int) -> int | None:
        """Length up to the earliest token in ``[start, end)`` that completes a stop string."""
        if not self.strings or self.decode is None or end <= start:
            return None
        window = self._window()
        if not self._holds_string(tokens[max(0, start + 1 - window) : end]):
            return None
        for k in range(start, end):
            if self._holds_string(tokens[max(0, k + 1 - window) : k + 1]):
                return k + 1
        return None

    def _holds_string(self, tokens: list[int]) -> bool:
        text = self.decode(tokens)  # type: ignore[misc]
        return any(s in text for s in self.strings)
