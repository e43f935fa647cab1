"""Step batches from hand-made per-token rows, for tests of the stages after the build, and
``reference_datum``: one trajectory's datum built alone, the reference a batch's datums equal."""

from __future__ import annotations

import numpy as np
import pytrio

from searchr1.advantages import ADVANTAGES, fill_advantages
from searchr1.advantages.config import AdvantageConfig
from searchr1.batch.shifted import shifted_arrays, truncate
from searchr1.batch.step_batch import StepBatch, build_step_batch
from searchr1.data.types import QAExample
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


def random_groups(vocab: int, n_groups: int, group_size: int, tokens: tuple[int, int] = (40, 120),
                  seed: int = 0) -> StepBatch:
    """``n_groups`` × ``group_size`` trajectories of random ids below ``vocab``: a prompt (a
    quarter), then actions with one observation inside; rewards 0 or 1 at random."""
    rng = np.random.default_rng(seed)
    trajs, group_D, member_D, rewards_G = [], [], [], []
    for g in range(n_groups):
        rewards_G.append(rng.integers(0, 2, group_size).astype(float))
        for m in range(group_size):
            n = int(rng.integers(*tokens))
            p = n // 4
            mask = np.ones(n, int)
            mask[:p] = 0
            mask[p + (n - p) // 3: p + (n - p) // 2] = 0  # an observation
            t = trajectory(rng.integers(0, vocab, n), mask, np.where(mask > 0, -rng.random(n), 0.0), p,
                           float(rewards_G[-1][m]), m)
            trajs.append(t)
            group_D.append(g)
            member_D.append(m)
    return build_step_batch(trajs, group_D, member_D, rewards_G, len(trajs), 10**9)


def two_turn(reward: float = 0.0, index: int = 0) -> Trajectory:
    """prompt [10, 11] · sampled [20, 21] · observation [30, 31, 32] · sampled [40, 41]."""
    t = Trajectory.start(EX, index, [10, 11])
    t.append_sampled([20, 21], [-0.5, -0.25])
    t.append_observation([30, 31, 32])
    t.append_sampled([40, 41], [-1.0, -2.0])
    t.reward = reward
    return t


def one_turn(reward: float = 0.0, index: int = 0) -> Trajectory:
    t = Trajectory.start(EX, index, [10, 12])
    t.append_sampled([50, 51, 52], [-0.1, -0.2, -0.3])
    t.reward = reward
    return t


def group_batch(trajs, max_tokens=100, obs=None, name="group_mean"):
    """One group of ``trajs``: old log-probs = sampler, advantages from estimator ``name``."""
    n = len(trajs)
    batch = build_step_batch(trajs, [0] * n, range(n), [np.array([t.reward for t in trajs])], n,
                             max_tokens, obs)
    batch.old_T = batch.sampler_T.copy()
    fill_advantages(batch, ADVANTAGES.get(name), AdvantageConfig(name=name))
    return batch


def as_datum(arrays: dict[str, np.ndarray]) -> pytrio.Datum:
    """Shifted arrays as a ``pytrio.Datum`` (float32 log-probs and advantages)."""
    return pytrio.Datum(
        model_input=pytrio.ModelInput.from_ints(arrays["model_input"].tolist()),
        loss_fn_inputs={"target_tokens": arrays["target_tokens"].astype(np.int64),
                        "logprobs": arrays["logprobs"].astype(np.float32),
                        "advantages": arrays["advantages"].astype(np.float32)})


def reference_datum(traj: Trajectory, advantage: float, max_tokens: int):
    """(datum, shifted arrays) of ``traj`` alone: the scalar ``advantage`` on every action token,
    the sampler's log-probs, cut to ``max_tokens`` — what the step batch must build for it."""
    advantages_T = np.asarray(traj.mask_T, dtype=np.float64) * advantage
    arrays = truncate(shifted_arrays(traj.tokens_T, traj.mask_T, traj.logprobs_T, advantages_T),
                      max_tokens)
    return as_datum(arrays), arrays
