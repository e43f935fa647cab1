"""Live progress inside the phases that take minutes on a CPU: each sampled turn shows.

A bar that counts questions or steps stands still until the first of them ends: an eval of
8 questions runs them all at once, so its bar sat at 0% for minutes on 2 cores, and a training
step (rollout, then update) takes a minute or more. ``WatchedSampler`` wraps a sampling client
and hands every response of ``sample_async`` to a ``TurnCounter``, which writes the turns and
tokens sampled so far, and the phase, beside the bar; the bar then moves every few seconds.
The wrapper changes nothing that is sampled: it forwards every call and attribute.
"""

from __future__ import annotations


class TurnCounter:
    """Turns and tokens sampled in one phase, shown as the postfix of a tqdm ``bar``."""

    def __init__(self, bar, prefix: str = "") -> None:
        self.bar, self.prefix = bar, prefix
        self.turns = self.tokens = 0

    def add(self, response) -> None:
        """Count the sequences of one sampling response and refresh the bar."""
        sequences = getattr(response, "sequences", None) or []
        self.turns += len(sequences)
        self.tokens += sum(len(getattr(s, "tokens", ()) or ()) for s in sequences)
        self.show(f"{self.turns} turns, {self.tokens} tokens")

    def show(self, text: str) -> None:
        self.bar.set_postfix_str(f"{self.prefix}{text}", refresh=True)

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

    ``StepRunner`` calls ``sampler`` when its rollout starts and ``training`` when it ends.
    """

    def __init__(self, bar) -> None:
        self.bar = bar
        self.step = 0
        self.last = ""  # the previous step's figures, kept beside the current phase

    def sampler(self, sampler, step: int):
        self.step = step + 1
        return TurnCounter(self.bar, f"{self.last}step {self.step} rollout: ").watch(sampler)

    def training(self) -> None:
        self.bar.set_postfix_str(f"{self.last}step {self.step}: updating the policy", refresh=True)

    def finished(self, figures: dict[str, str]) -> None:
        """After a step: its figures (``{"R": "0.3", …}``) stay on the bar."""
        self.last = " ".join(f"{k}={v}" for k, v in figures.items()) + " | " if figures else ""
        self.bar.set_postfix_str(self.last.removesuffix(" | "), refresh=True)
