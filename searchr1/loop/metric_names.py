"""Metric names of a step's row (``trainer.metric_names``).

- ``ours`` (default): every engine metric of the update is ``train/<key>``, beside the
  step's other ``train/*`` values.
- ``lab``: the keys the lab logs as ``trainer/<key>`` — PyTRIO's forward-backward metrics
  ``loss_sum``, ``loss_mean`` and ``token_count`` — are renamed from ``train/<key>`` to
  ``trainer/<key>``, so a dashboard or script written for the lab's runs reads ours. Applied
  once, to the finished row, just before it is logged (``loop/trainer.py``); everything
  inside the loop keeps reading the ``train/*`` names.
"""

from __future__ import annotations

METRIC_NAMES = ("ours", "lab")
#: the fields of PyTRIO's forward-backward metrics (``TrainerForwardMetrics``)
FORWARD_KEYS = ("loss_sum", "loss_mean", "token_count")
LAB_NAMES = {f"train/{key}": f"trainer/{key}" for key in FORWARD_KEYS}


def named_metrics(metrics: dict[str, float], scheme: str) -> dict[str, float]:
    """``metrics`` under the naming ``scheme`` (module docstring); order is kept."""
    if scheme not in METRIC_NAMES:
        raise ValueError(f"trainer.metric_names must be one of {METRIC_NAMES}, got {scheme!r}")
    if scheme == "ours":
        return dict(metrics)
    return {LAB_NAMES.get(key, key): value for key, value in metrics.items()}
