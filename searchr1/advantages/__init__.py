"""Advantage estimators (``advantage.name``): importing this package registers them all.

Each is one ``Estimator`` over the step batch's columns (``advantages/base.py``):
``group_mean`` and ``grpo_std`` broadcast a group-relative outcome scalar
(``advantages/group.py``); ``ppo_gae`` runs GAE on a critic's values (``advantages/gae.py``).
``fill_advantages`` writes an estimator's output into the batch's columns. The critic's
algorithm half (its batch, update and metrics, over a ``ValueModel``) is ``advantages/critic.py``.
"""

from searchr1.advantages.base import (ADVANTAGES, Estimator, TokenAdvantages, fill_advantages, is_degenerate,
                                      signal_members)
from searchr1.advantages import gae, group  # noqa: F401  (register each name)
from searchr1.advantages.group import group_mean, grpo_std

__all__ = ["ADVANTAGES", "Estimator", "TokenAdvantages", "fill_advantages", "group_mean", "grpo_std",
           "is_degenerate", "signal_members"]
