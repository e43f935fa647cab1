"""The paper's observation-mask ablation: ``rollout.mask_observations=false``.

By default retrieved tokens stay in the context but carry no loss (mask 0, old log-prob 0,
advantage 0): the policy is never trained to "generate" text it did not write. The paper's
ablation (Search-R1, Table 5: average EM 0.431 with the mask vs 0.343 without, Qwen2.5-7B base)
trains on them as if the model had written them. Here that means: every observation token after
the prompt gets mask 1 — so it receives the trajectory's advantage and a loss — and an old
log-prob from scoring the whole trajectory with the sampling weights (``compute_logprobs`` of
the policy's sampling client), exactly what a sampler would have reported had it produced those
tokens. The prompt itself stays masked in both settings, as in the paper.
"""

from __future__ import annotations

import asyncio

import pytrio

from searchr1.rollout.types import Trajectory


def apply_unmasked(traj: Trajectory, logprobs_T: list[float | None]) -> int:
    """Mark the observation tokens of ``traj`` as trained, with their scored log-probs.

    ``logprobs_T[i]`` is the log-prob of token ``i`` given the tokens before it (the first is
    None). Returns how many tokens were unmasked.
    """
    if len(logprobs_T) != len(traj.tokens_T):
        raise ValueError(f"{len(logprobs_T)} log-probs for a trajectory of {len(traj.tokens_T)} tokens")
    unmasked = 0
    for i in range(traj.prompt_len, len(traj.tokens_T)):
        if traj.mask_T[i] == 0:
            traj.mask_T[i] = 1
            traj.logprobs_T[i] = float(logprobs_T[i] or 0.0)
            unmasked += 1
    return unmasked


async def unmask_observations(trajs: list[Trajectory], sampler) -> int:
    """Score every trajectory with ``sampler`` (concurrently) and unmask its observations."""
    scored = await asyncio.gather(*(
        sampler.compute_logprobs_async(pytrio.ModelInput.from_ints(list(t.tokens_T))) for t in trajs
    ))
    return sum(apply_unmasked(t, lp) for t, lp in zip(trajs, scored))
