"""Metric names of a step's row (``trainer.metric_names``): registered namings.

- ``ours`` (default): every engine metric of the update is ``train/<key>``, beside the
  step's other ``train/*`` values.
- ``lab``: the keys the lab logs as ``trainer/<key>`` — PyTRIO's forward-backward metrics
  ``loss_sum``, ``loss_mean`` and ``token_count`` — are renamed from ``train/<key>`` to
  ``trainer/<key>``, so a dashboard or script written for the lab's runs reads ours. Applied
  once, to the finished row, just before it is logged (``loop/trainer.py``); everything
  inside the loop keeps reading the ``train/*`` names.
"""

from __future__ import annotations

from collections.abc import Callable

from searchr1.utils.registry import Registry

#: a naming: the finished row → the row as logged (a new dict; order kept)
Naming = Callable[[dict[str, float]], dict[str, float]]
METRIC_NAMES: Registry[Naming] = Registry("trainer.metric_names")
#: the fields of PyTRIO's forward-backward metrics (``TrainerForwardMetrics``)
FORWARD_KEYS = ("loss_sum", "loss_mean", "token_count")
LAB_NAMES = {f"train/{key}": f"trainer/{key}" for key in FORWARD_KEYS}


@METRIC_NAMES.register("ours")
def ours(metrics: dict[str, float]) -> dict[str, float]:
    """The row as the loop wrote it."""
    return dict(metrics)


@METRIC_NAMES.register("lab")
def lab(metrics: dict[str, float]) -> dict[str, float]:
    """PyTRIO's forward-backward metrics under the lab's ``trainer/<key>``."""
    return {LAB_NAMES.get(key, key): value for key, value in metrics.items()}


def named_metrics(metrics: dict[str, float], scheme: str) -> dict[str, float]:
    """``metrics`` under the naming ``scheme`` (module docstring)."""
    return METRIC_NAMES.get(scheme)(metrics)
