"""Policy losses (the five PyTRIO names) and the KL-to-reference term.

``POLICY_LOSSES`` maps each pytrio loss name to its pure function and to the pytrio total
that normalises it; ``LossConfig`` is the schema of the ``loss`` config group.
"""

from searchr1.losses.kl import (
    KL_ESTIMATORS,
    KLConfig,
    kl_estimate,
    kl_loss_term,
    kl_penalty_advantages,
)
from searchr1.losses.policy import (
    POLICY_LOSSES,
    LossConfig,
    LossSpec,
    finalize_metrics,
    loss_fn_config,
    validate_loss_config,
)

__all__ = [
    "KL_ESTIMATORS",
    "KLConfig",
    "LossConfig",
    "LossSpec",
    "POLICY_LOSSES",
    "finalize_metrics",
    "kl_estimate",
    "kl_loss_term",
    "kl_penalty_advantages",
    "loss_fn_config",
    "validate_loss_config",
]
