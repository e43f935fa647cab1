"""Loss math only: policy losses (the five PyTRIO names), KL, entropy, value loss and
aggregation. Importing this package is torch-free (``config`` is); the torch modules
load on first use of one of their names.
"""

from __future__ import annotations

import importlib

from searchr1.losses.config import (  # noqa: F401
    Aggregation,
    KLConfig,
    KLEstimator,
    KLPlacement,
    LossConfig,
    OldLogprobs,
)

_LAZY = {
    "KL_ESTIMATORS": "kl", "kl_estimate": "kl", "kl_loss_term": "kl",
    "kl_penalty_advantages": "kl",
    "POLICY_LOSSES": "policy", "LossSpec": "policy", "finalize_metrics": "policy",
    "loss_fn_config": "policy", "validate_loss_config": "policy",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"searchr1.losses.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'searchr1.losses' has no attribute {name!r}")
