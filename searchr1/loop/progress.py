"""Live progress inside the phases that take minutes on a CPU: turns and tokens as they come.

A bar that counts questions or steps stands still until the first of them ends: an eval of
8 questions runs them all at once, so its bar sat at 0% for minutes on 2 cores, and a training
step (rollout, then update) takes a minute or more. ``TurnCounter`` writes beside the bar the
turns sampled so far and the tokens picked so far: every response of ``sample_async`` (through
``WatchedSampler``, which changes nothing that is sampled: it forwards every call and
attribute) and, while a turn decodes, every few seconds (``ticking``) the count the local
sampler keeps per decode step (``engines.base.CountsTokens``; a sampler without it shows the
tokens of finished turns).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from searchr1.engines.base import CountsTokens

TICK_S = 2.0


def live_tokens(sampler) -> Callable[[], int] | None:
    """Tokens the sampler has picked since now, read live; None if it does not count them."""
    if not isinstance(sampler, CountsTokens):
        return None
    start = sampler.tokens_picked()
    return lambda: sampler.tokens_picked() - start


class TurnCounter:
    """Turns and tokens sampled in one phase, shown as the postfix of a tqdm ``bar``."""

    def __init__(self, bar, prefix: str = "", sampler=None) -> None:
        self.bar, self.prefix = bar, prefix
        self.turns = self.tokens = 0
        self.live = live_tokens(sampler)

    def add(self, response) -> None:
        """Count the sequences of one sampling response and refresh the bar."""
        sequences = response.sequences
        self.turns += len(sequences)
        self.tokens += sum(len(s.tokens) for s in sequences)
        self.show()

    def text(self) -> str:
        tokens = max(self.tokens, self.live()) if self.live else self.tokens
        return f"{self.prefix}{self.turns} turns, {tokens} tokens"

    def show(self) -> None:
        self.bar.set_postfix_str(self.text(), refresh=True)

    async def ticking(self, seconds: float = TICK_S) -> None:
        """Refresh the bar every ``seconds`` until cancelled (a turn decoding shows its tokens)."""
        while True:
            await asyncio.sleep(seconds)
            self.show()

    def watch(self, sampler) -> WatchedSampler:
        return WatchedSampler(sampler, self)


class WatchedSampler:
    """A sampling client whose ``sample_async`` responses also go to ``counter``."""

    def __init__(self, inner, counter: TurnCounter) -> None:
        self._inner, self._counter = inner, counter

    async def sample_async(self, *args, **kwargs):
        response = await self._inner.sample_async(*args, **kwargs)
        self._counter.add(response)
        return response

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class StepProgress:
    """What a training step is doing, on the trainer's bar: its rollout's turns, then the update.

    ``StepRunner`` calls ``sampler`` when its rollout starts (inside the event loop: the
    ticking starts there) and ``training`` when it ends.
    """

    def __init__(self, bar) -> None:
        self.bar = bar
        self.step = 0
        self.last = ""  # the previous step's figures, kept beside the current phase
        self._ticker: asyncio.Task | None = None

    def sampler(self, sampler, step: int):
        self.step = step + 1
        counter = TurnCounter(self.bar, f"{self.last}step {self.step} rollout: ", sampler)
        self._stop_ticking()
        self._ticker = asyncio.get_running_loop().create_task(counter.ticking())
        return counter.watch(sampler)

    def training(self) -> None:
        self._stop_ticking()
        self.bar.set_postfix_str(f"{self.last}step {self.step}: updating the policy", refresh=True)

    def finished(self, figures: dict[str, str]) -> None:
        """After a step: its figures (``{"R": "0.3", …}``) stay on the bar."""
        self._stop_ticking()
        self.last = " ".join(f"{k}={v}" for k, v in figures.items()) + " | " if figures else ""
        self.bar.set_postfix_str(self.last.removesuffix(" | "), refresh=True)

    def _stop_ticking(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
