"""Schema of the ``rollout`` config group: limits, sampling and the rollout's policies.

Every field's default is written here once; ``conf/rollout/default.yaml`` and the presets only
state what they change.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from omegaconf import DictConfig

from searchr1.rollout.tool_errors import ToolErrorPolicy
from searchr1.utils.schema import Checked, field_value, member, ranged

MIN_TRAJECTORY_TOKENS = 64  # no protocol's prompt plus one turn fits in fewer tokens

#: How a rollout is scheduled. ``async`` is a Python keyword, hence the functional form;
#: OmegaConf converts a config string to a member by name.
RolloutSchedule = Enum(
    "RolloutSchedule",
    [
        ("async", "async"),  # each trajectory advances on its own (searchr1/rollout/engine.py)
        ("lockstep", "lockstep"),  # all active trajectories advance one turn at a time
    ],
    type=str,
)
RolloutSchedule.__doc__ = "How a rollout is scheduled: async (default) | lockstep."


class LockstepSearch(str, Enum):
    """How a lockstep turn runs its searches."""

    batched = "batched"  # one retriever call with all the turn's queries (the paper's code)
    serial = "serial"  # one search at a time, in trajectory order (the lab's code)


def check_schedule(schedule: object, lockstep_search: object) -> tuple[Enum, LockstepSearch]:
    """Both settings as enum members; a ValueError listing the valid ones otherwise (Hydra
    checks them at compose; this covers a ``RolloutConfig`` built in Python)."""
    return (member(RolloutSchedule, schedule, "rollout.schedule"),
            member(LockstepSearch, lockstep_search, "rollout.lockstep_search"))


class ScriptedPolicy(str, Enum):
    """What ``rollout.scripted_policy`` forces the model to do (null = nothing)."""

    search_until_budget = "search_until_budget"


@dataclass
class RolloutConfig(Checked):
    """Limits and sampling of the multi-turn rollout."""

    group_size: int = ranged(4, ge=1)  # trajectories per question (GRPO group)
    max_searches: int = ranged(2, ge=0)  # search calls per trajectory; then one last turn without search
    max_turns: int = ranged(3, ge=1)  # assistant turns per trajectory
    max_trajectory_tokens: int = 2048  # prompt + all turns + observations
    max_turn_tokens: int = ranged(128, gt=0)  # tokens sampled per assistant turn
    max_observation_tokens: int = ranged(384, gt=0)  # tokens of one observation (whole passages dropped first)
    # sampler context limit (paper max_prompt_length 4096): left-truncate the running context
    # to this many tokens; null = never. Turns sampled from a cut context are not trained ...
    max_prompt_tokens: int | None = None
    # ... unless this is true (the official trains them on the full trajectory's context)
    train_truncated_turns: bool = False
    temperature: float = ranged(1.0, ge=0)  # sampling temperature during training rollouts
    top_p: float = ranged(1.0, gt=0, le=1)  # nucleus sampling threshold
    top_k: int = ranged(-1, ge=1, off=-1)  # -1 = no top-k truncation
    sampler_concurrency: int = ranged(256, ge=1)  # sampling requests in flight at once
    search_concurrency: int = ranged(32, ge=1)  # search requests in flight at once
    # a trajectory whose search failed (error, or empty where results are due): drop_group |
    # drop_trajectory | observe (train on it; the ablation) — searchr1/rollout/tool_errors.py
    on_tool_error: ToolErrorPolicy = ToolErrorPolicy.drop_group
    # false = the paper's ablation: retrieved tokens get the trajectory's advantage and a loss,
    # their old log-probs from scoring with the sampling weights (searchr1/batch/step_batch.py)
    mask_observations: bool = True
    # async = each trajectory on its own; lockstep = all advance one turn at a time, as the
    # paper and the lab do (an ablation of timing only) — searchr1/rollout/lockstep.py
    schedule: RolloutSchedule = RolloutSchedule["async"]
    # lockstep only: batched = one search call per turn (paper) | serial = one by one (lab)
    lockstep_search: LockstepSearch = LockstepSearch.batched
    # benchmarks only: search_until_budget forces <search> question </search> until
    # max_searches, then <answer>, each turn max_turn_tokens long (searchr1/rollout/scripted.py)
    scripted_policy: ScriptedPolicy | None = None

    @classmethod
    def problems(cls, node: DictConfig, path: str) -> list[str]:
        """The trajectory budget must hold a prompt and a whole turn."""
        total = field_value(node, "max_trajectory_tokens")
        turn = field_value(node, "max_turn_tokens")
        floor = max(MIN_TRAJECTORY_TOKENS, turn + 1) if isinstance(turn, int) else None
        if isinstance(total, int) and floor is not None and total < floor:
            return [f"{path}.max_trajectory_tokens={total} leaves no room for a prompt and a turn "
                    f"(needs >= {floor}: max_turn_tokens + a prompt)"]
        return []
