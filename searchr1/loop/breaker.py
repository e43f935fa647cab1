"""Search circuit breaker: stop a run whose searches keep failing, instead of training on it.

After each step the trainer calls ``CircuitBreaker.observe(metrics, quota_exhausted)``.
The breaker keeps the last ``window`` steps' search counts (``search/step_requests`` and
``search/step_error_rate``, counted from the step's own trajectories by
``rollout/step_metrics.py``) and takes the error rate over the window as
``sum(errors) / sum(requests)``. A step whose window rate is at or above ``threshold`` is
*over*; the breaker trips when more than ``grace_steps`` consecutive steps are over (so it
tolerates ``grace_steps`` bad steps and trips on the next), and at once when the retriever
reports every key's quota exhausted. A step below the threshold resets the count: the run
recovers. Steps (or whole windows) without searches give no evidence and are never over.

While over but within the grace period, ``pause_s`` is a backoff the trainer sleeps before
the next step (``backoff_s`` doubling per over step; 0 = none), so rate limits can cool down.

A trip raises nothing here: ``observe`` returns the reason; the trainer checkpoints and
raises ``SearchOutage``, which ``main.py`` turns into ``summary.json``'s ``stopped_reason``,
a resume hint and exit code ``EXIT_SEARCH_OUTAGE``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from searchr1.loop.config import BreakerConfig

EXIT_SEARCH_OUTAGE = 3  # main.py's exit code when the breaker stopped the run


class SearchOutage(Exception):
    """The breaker tripped after ``step`` (already checkpointed); ``summary`` is the run so far."""

    exit_code = EXIT_SEARCH_OUTAGE

    def __init__(self, reason: str, step: int, summary: Mapping[str, float] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step
        self.summary = dict(summary or {})


def quota_exhausted(retriever) -> bool:
    """Whether ``retriever`` has no usable key left (Zhihu: every key retired).

    Reads the retriever's ``quota_exhausted`` (declared on ``Retriever``: False for retrievers
    without keys; ``ZhihuRetriever`` overrides it, a ``CachedRetriever`` forwards it).
    """
    return retriever.quota_exhausted is True


class CircuitBreaker:
    """Sliding-window search error rate with a grace period (pure: no I/O, no clocks)."""

    def __init__(self, cfg: BreakerConfig) -> None:
        if cfg.window < 1:
            raise ValueError(f"trainer.breaker.window must be >= 1, got {cfg.window}")
        if not 0.0 < cfg.threshold <= 1.0:
            raise ValueError(f"trainer.breaker.threshold must be in (0, 1], got {cfg.threshold}")
        if cfg.grace_steps < 0:
            raise ValueError(f"trainer.breaker.grace_steps must be >= 0, got {cfg.grace_steps}")
        if cfg.backoff_s < 0:
            raise ValueError(f"trainer.breaker.backoff_s must be >= 0, got {cfg.backoff_s}")
        self.cfg = cfg
        self._window: deque[tuple[float, float]] = deque(maxlen=cfg.window)  # (requests, errors)
        self.over_steps = 0  # consecutive steps at or above the threshold
        self.rate = 0.0  # the window's error rate after the last observed step

    @property
    def pause_s(self) -> float:
        """Backoff before the next step: 0 unless over the threshold within the grace period."""
        if not self.over_steps or not self.cfg.backoff_s:
            return 0.0
        return self.cfg.backoff_s * 2 ** (self.over_steps - 1)

    def observe(self, metrics: Mapping[str, float], quota_exhausted: bool = False) -> str | None:
        """Record one step's metrics; the reason to stop the run, or None to go on."""
        if not self.cfg.enabled:
            return None
        requests = float(metrics.get("search/step_requests", 0.0))
        errors = float(metrics.get("search/step_error_rate", 0.0)) * requests
        self._window.append((requests, errors))
        served = sum(r for r, _ in self._window)
        self.rate = sum(e for _, e in self._window) / served if served else 0.0
        if quota_exhausted:
            return "search quota exhausted: the retriever reports every key's quota used up"
        if served and self.rate >= self.cfg.threshold:
            self.over_steps += 1
        else:
            self.over_steps = 0
        if self.over_steps > self.cfg.grace_steps:
            n = len(self._window)
            return (f"search outage: the search error rate over the last {n} step(s) was "
                    f"{self.rate:.0%} (>= trainer.breaker.threshold={self.cfg.threshold:g}) for "
                    f"{self.over_steps} consecutive step(s), more than "
                    f"trainer.breaker.grace_steps={self.cfg.grace_steps}")
        return None
