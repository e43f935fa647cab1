"""Outcome rewards: one pure function per option, registered by name (``reward=<name>``).

A reward sees only a ``RewardInput`` — the trajectory's extracted final answer, the gold
answers and the protocol's format verdict — and returns a float. Scalars (penalties,
format scores) are keyword arguments with the paper's defaults; ``build_reward`` binds the
ones a function declares from ``RewardConfig``, so no reward ever receives a config object.

Two choices apply to every reward and so live on the ``Reward`` that ``build_reward``
returns rather than in each function: ``answer_rule`` (a registered rule giving the final
answer and the format verdict, ``answer_rule.py``; applied by ``rollout/scoring.py``) and
``normalize`` (the punctuation set:
``ascii`` | ``unicode`` | ``lab``, ``normalize.py``). ``normalize`` is also bound to the
function, which compares the answer and the golds under that one set.
"""

from searchr1.rewards.base import (  # noqa: F401
    REWARDS,
    Reward,
    RewardConfig,
    RewardFn,
    RewardInput,
    build_reward,
)
from searchr1.rewards import em, em_format, em_format_paper  # noqa: E402,F401  (register each name)
