"""Step batches from hand-made per-token rows, for tests of the stages after the build."""

from __future__ import annotations

import numpy as np

from searchr1.data.types import QAExample
from searchr1.loop.step_batch import StepBatch, build_step_batch
from searchr1.rollout.types import Trajectory

EX = QAExample(id="q", question="?", golden_answers=("a",), data_source="t")


def trajectory(tokens_T, mask_T, logprobs_T, prompt_len: int = 1, reward: float = 0.0,
               group_index: int = 0) -> Trajectory:
    """A trajectory with exactly these per-token lists (unshifted)."""
    t = Trajectory(EX, group_index, list(map(int, tokens_T)), list(map(int, mask_T)),
                   list(map(float, logprobs_T)), prompt_len)
    t.reward = reward
    return t


def batch_from_rows(tokens_D, mask_D, logprobs_D, advantages_D, n_trajectories=None) -> StepBatch:
    """A batch whose shifted rows are the given ones: ``tokens_D[d]`` has one more token than
    the other rows; each datum its own group; old log-probs = the sampler's."""
    trajs = [trajectory(tok, [0, *m], [0.0, *lp]) for tok, m, lp in zip(tokens_D, mask_D, logprobs_D)]
    n = len(trajs)
    batch = build_step_batch(trajs, range(n), [0] * n, [np.zeros(1)] * n,
                             n if n_trajectories is None else n_trajectories, 10**9)
    batch.old_T = batch.sampler_T.copy()
    batch.set_rows("advantages_T", [np.asarray(a, float) * np.asarray(m, float)
                                    for a, m in zip(advantages_D, mask_D)])
    return batch
