"""The step batch: every datum of one RL step as typed columns, built once from trajectories.

Layout: per-token columns (suffix ``_T``) are flat arrays holding every datum's tokens one
after another; datum ``d`` owns ``offsets[d]:offsets[d + 1]``. Per-datum columns end in
``_D``. Token position ``i`` of a datum is the prediction of ``tokens[i + 1]`` from
``tokens[: i + 1]`` (the shifted layout of ``batch/shifted.py``, pytrio's ``auto_shift=False``)::

    input_T    tokens[:-1]                    next_T     tokens[1:]
    mask_T     1 where the target is trained   sampler_T  the sampler's log-prob there, else 0

Built once (``build_step_batch``) from the selected trajectories, which are never patched:
the observation-mask ablation (``rollout.mask_observations=false``) is a column rule applied
here (``trained_columns``). Later stages fill ``old_T`` (ratio baseline), ``ref_T``
(reference log-probs), ``values_T`` (critic), ``penalty_T`` (coef·KL when KL is in the
reward), ``advantages_T``, ``returns_T`` and ``value_mask_T`` (where the critic is fitted:
``advantage.gae_domain``'s tokens); the update's packing plan is stored in ``plan``.
``pytrio.Datum``s exist only at a call site (``datums``), with the per-datum weights of that
call. ``select`` keeps whole datums (with their group ids), so a batch splits by groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pytrio

from searchr1.batch.shifted import IGNORE, shifted_arrays, truncate
from searchr1.utils.tensor_data import tensor_data

if TYPE_CHECKING:  # read by field only: the batch layer imports no rollout module
    from searchr1.rollout.types import Trajectory

TOKEN_COLUMNS = ("input_T", "next_T", "mask_T", "sampler_T", "old_T", "ref_T", "values_T",
                 "penalty_T", "advantages_T", "returns_T", "value_mask_T")
DATUM_COLUMNS = ("group_D", "member_D", "reward_D")
#: what a training call sends per datum; scoring calls send the targets only
TRAIN_INPUTS = ("target_tokens", "logprobs", "advantages")


@dataclass(frozen=True)
class Plan:
    """How the update sends the batch: mini-batches (optimizer steps) and their FFD bins.

    Under data parallelism a mini-batch is global: ``minibatches[k]`` is this rank's share
    of it (possibly empty) and ``shares[k]`` places that share in it (``MinibatchShare``).
    """

    minibatches: list[list[int]]  # this rank's datum ids per optimizer step, in rollout order
    bins: list[list[list[int]]]  # per mini-batch: datum ids per micro-batch
    shares: list = field(default_factory=list)  # per mini-batch: this rank's MinibatchShare

    def sent(self, k: int) -> list[int]:
        """Datum ids of mini-batch ``k`` in send order (bin after bin)."""
        return [d for b in self.bins[k] for d in b]

    @property
    def all_bins(self) -> list[list[int]]:
        return [b for part in self.bins for b in part]


@dataclass
class StepBatch:
    """The columns of one step's datums (module docstring)."""

    offsets: np.ndarray  # [D + 1] start of each datum's tokens in the ``_T`` columns
    input_T: np.ndarray  # int64 model input
    next_T: np.ndarray  # int64 next token (the target, before masking)
    mask_T: np.ndarray  # float64, 1 on trained targets
    sampler_T: np.ndarray  # sampler log-prob on trained targets, 0 elsewhere
    group_D: np.ndarray  # index of the datum's group in ``rewards_G``
    member_D: np.ndarray  # the datum's index within its group
    reward_D: np.ndarray  # outcome reward
    rewards_G: list[np.ndarray]  # every reward of each group (members without datums too)
    n_trajectories: float  # trajectories these datums stand for (dropped ones included)
    old_T: np.ndarray | None = None
    ref_T: np.ndarray | None = None
    values_T: np.ndarray | None = None
    penalty_T: np.ndarray | None = None
    advantages_T: np.ndarray | None = None
    returns_T: np.ndarray | None = None
    value_mask_T: np.ndarray | None = None
    plan: Plan | None = field(default=None, compare=False)

    # ----- shape ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths_D(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def loss_tokens_D(self) -> np.ndarray:
        """Trained targets per datum."""
        return np.array([float(m.sum()) for m in self.rows("mask_T")])

    # ----- columns -------------------------------------------------------------------------
    def row(self, name: str, d: int) -> np.ndarray:
        """Datum ``d``'s slice of token column ``name`` (a view)."""
        col = getattr(self, name)
        if col is None:
            raise ValueError(f"column {name} is not filled yet")
        return col[self.offsets[d]:self.offsets[d + 1]]

    def rows(self, name: str, idx: Sequence[int] | None = None) -> list[np.ndarray]:
        return [self.row(name, d) for d in (range(self.size) if idx is None else idx)]

    def call_logprobs(self, d: int, output, masked: bool = True) -> np.ndarray:
        """Datum ``d``'s target log-probs from one output of a trainer call (``loss_fn_outputs``),
        float64, 0 off the mask unless ``masked=False``."""
        mask = self.row("mask_T", d)
        lp = np.asarray(output["logprobs"].tolist(), dtype=np.float64)[: len(mask)]
        return lp * mask if masked else lp

    def set_rows(self, name: str, rows_D: Sequence[np.ndarray]) -> None:
        """Fill token column ``name`` from one array per datum (lengths must match)."""
        if name not in TOKEN_COLUMNS:
            raise ValueError(f"{name} is not a token column")
        lengths = [len(r) for r in rows_D]
        if lengths != self.lengths_D.tolist():
            raise ValueError(f"{name}: row lengths {lengths} != datum lengths {self.lengths_D.tolist()}")
        flat = np.concatenate([np.asarray(r, np.float64) for r in rows_D]) if rows_D else np.zeros(0)
        setattr(self, name, flat)

    def select(self, idx: Sequence[int]) -> StepBatch:
        """The datums ``idx`` (in that order) as their own batch; the plan is not kept."""
        idx = list(idx)
        lengths = self.lengths_D[idx] if idx else np.zeros(0, np.int64)
        cols = {}
        for name in TOKEN_COLUMNS:
            col = getattr(self, name)
            cols[name] = None if col is None else (
                np.concatenate(self.rows(name, idx)) if idx else col[:0].copy())
        for name in DATUM_COLUMNS:
            cols[name] = getattr(self, name)[idx]
        share = len(idx) / self.size if self.size else 0.0
        return replace(self, offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                       n_trajectories=self.n_trajectories * share, plan=None, **cols)

    def datums(self, idx: Sequence[int] | None = None, weights: Sequence[float] | None = None,
               inputs: Sequence[str] = TRAIN_INPUTS) -> list[pytrio.Datum]:
        """``pytrio.Datum``s of ``idx``: targets −100 off the mask, advantages × ``weights``."""
        idx = range(self.size) if idx is None else idx
        weights = [1.0] * len(idx) if weights is None else weights
        return [self._datum(d, w, inputs) for d, w in zip(idx, weights)]

    def _datum(self, d: int, weight: float, inputs: Sequence[str]) -> pytrio.Datum:
        mask = self.row("mask_T", d)
        columns = {
            "target_tokens": lambda: np.where(mask > 0, self.row("next_T", d), IGNORE).astype(np.int64),
            "logprobs": lambda: self.row("old_T", d).astype(np.float32),
            "advantages": lambda: (self.row("advantages_T", d) * weight).astype(np.float32),
        }
        # built without pydantic's per-element re-validation (utils/tensor_data.py): the
        # columns already have pytrio's dtypes; pytrio's planner still checks every datum
        return pytrio.Datum.model_construct(
            model_input=pytrio.ModelInput.from_ints(self.row("input_T", d).tolist()),
            loss_fn_inputs={k: tensor_data(columns[k]()) for k in inputs})


# ------------------------------------------------------------------------------ building


def trained_columns(traj: Trajectory, observation_logprobs_T: Sequence[float | None] | None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(mask, log-probs) per token of ``traj`` under the observation rule, unshifted.

    Default (``observation_logprobs_T`` None): the trajectory's own mask (1 on sampled tokens)
    and sampler log-probs. The ablation: every token after the prompt is trained, observation
    tokens with the log-prob the sampling weights gave them (``observation_logprobs_T[i]`` is
    log p(token i | tokens before), the first None); the prompt stays masked in both.
    """
    mask = np.asarray(traj.mask_T, np.float64)
    logprobs = np.asarray(traj.logprobs_T, np.float64)
    if observation_logprobs_T is None:
        return mask, logprobs
    if len(observation_logprobs_T) != len(traj.tokens_T):
        raise ValueError(f"{len(observation_logprobs_T)} log-probs for a trajectory of "
                         f"{len(traj.tokens_T)} tokens")
    scored = np.array([0.0 if x is None else float(x) for x in observation_logprobs_T])
    after_prompt = np.arange(len(mask)) >= traj.prompt_len
    return np.where(after_prompt, 1.0, mask), np.where(mask > 0, logprobs, np.where(after_prompt, scored, 0.0))


def trained_tokens(traj: Trajectory, mask_observations: bool) -> int:
    """How many tokens of ``traj`` would carry loss (before the shift and truncation)."""
    return traj.num_action_tokens if mask_observations else len(traj.tokens_T) - traj.prompt_len


def unmasked_observation_tokens(trajs: Sequence[Trajectory]) -> int:
    """Observation tokens the ablation trains on (masked tokens after each prompt)."""
    return sum(int(sum(1 for m in t.mask_T[t.prompt_len:] if m == 0)) for t in trajs)


def build_step_batch(trajs_D: Sequence[Trajectory], group_D: Sequence[int], member_D: Sequence[int],
                     rewards_G: Sequence[np.ndarray], n_trajectories: float, max_tokens: int,
                     observation_logprobs_D: Sequence[Sequence[float | None]] | None = None) -> StepBatch:
    """The batch of ``trajs_D``: shifted, truncated to ``max_tokens``, observation rule applied."""
    rows = []
    for d, t in enumerate(trajs_D):
        obs = None if observation_logprobs_D is None else observation_logprobs_D[d]
        mask, logprobs = trained_columns(t, obs)
        rows.append(truncate(shifted_arrays(t.tokens_T, mask, logprobs, np.zeros(len(mask))), max_tokens))
    cat = lambda key, dtype: (np.concatenate([r[key] for r in rows]) if rows else np.zeros(0)).astype(dtype)
    lengths = [len(r["mask"]) for r in rows]
    return StepBatch(
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        input_T=cat("model_input", np.int64), next_T=cat("tokens_next", np.int64),
        mask_T=cat("mask", np.float64), sampler_T=cat("logprobs", np.float64),
        group_D=np.asarray(group_D, np.int64), member_D=np.asarray(member_D, np.int64),
        reward_D=np.array([t.reward for t in trajs_D], np.float64),
        rewards_G=[np.asarray(r, np.float64) for r in rewards_G], n_trajectories=float(n_trajectories))

