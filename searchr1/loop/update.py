"""The update stage: the step batch → one or several optimizer steps (the critic's: the step).

Takes its own settings (``UpdateSettings``: a slice of ``loss`` and ``trainer``), not the
root config, and talks to the engine only through the PyTRIO client API.

Mini-batches: ``trainer.minibatch_trajectories`` datums per optimizer step, contiguous, so
each datum is trained exactly once per rollout (verl's ``ppo_epochs=1`` and
``batch.split(ppo_mini_batch_size)``; 2,560 trajectories / 256 = 10 steps). Within a
mini-batch, datums are sent in first-fit-decreasing order (``plan_update``, stored in the
batch's ``plan``) so the local engine's chunker cuts exactly the packed micro-batches. Under
data parallelism the mini-batches are global (``dp.minibatches``: cut from every rank's
datums in rank order) and the plan packs this rank's share of each; the *loss* micro-batches of
``microbatch_token_mean`` are the mini-batch's datums in rollout order, in groups of
``trainer.microbatch_trajectories`` (verl's ``ppo_micro_batch_size``), whatever order they
are sent in.

Which call: the built-in ``forward_backward(loss.name)`` whenever a built-in can express the
objective — no entropy bonus, no KL in the loss, and either ``token_mean`` (pytrio's own
normalisation by the call's active tokens) or another aggregation with a loss that is
linear in A (importance_sampling, ppo, cispo): then each datum's advantages are multiplied
by w_d = N_tok / (n · n_d) (n_d its tokens, n the trajectories or micro-batches, N_tok the
call's tokens; for micro-batches n_d is the micro-batch's tokens), which turns pytrio's
token mean into exactly the chosen aggregation — the lab's own trick (n_k/N scaling), and
what keeps ``experiment=lab`` on pytrio's built-in importance_sampling (the rule and its
denominators live in ``losses/aggregation.py``, the one owner of aggregation). Otherwise (entropy
bonus, KL in the loss, dro with a non-token-mean aggregation) ``forward_backward_custom``
with ``losses.objective.actor_objective``.

Pipelined (tinker-cookbook's ``train_step``): ``submit_minibatch`` queues a mini-batch's
forward_backward and then its optim_step without waiting, and ``update_stage`` queues
mini-batch k+1's calls before it awaits mini-batch k's results (``collect_minibatch``), so a
remote trainer (``engine=trio``) never idles while a result travels back and the next call
is built and sent. The engine runs a training client's calls in submission order (pytrio
numbers them), so gradients accumulate over the mini-batch's micro-batches, then one
optimizer step, and every result is the call-by-call schedule's; the local engine computes
each call when it is made, in the same order as before. On failure: a failed call is
reported when its result is awaited, by which time the calls after it may be queued; the
error ends the run as before, and a resume starts from the last checkpoint, before them.

Metrics: per-mini-batch values are combined explicitly — counters (``token_count``) are
summed, the optimizer's ``step`` and the LR are the last mini-batch's, rates and means
(loss, clip fraction, ratio, KL, grad norm) are averaged; the sampler-vs-trainer mismatch
and the entropy are from the first mini-batch only (the only one sampled by the same
weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytrio
from pytrio.types import APIFuture
import torch

from searchr1.advantages.critic import critic_batch, update_critic
from searchr1.losses.aggregation import GlobalTotals, datum_weights, global_totals
from searchr1.losses.config import Aggregation, KLPlacement, LossConfig, OldLogprobs
from searchr1.losses.objective import ObjectiveSpec, SeparableObjective, actor_objective, objective_sums
from searchr1.losses.policy import loss_fn_config
from searchr1.distributed.context import SINGLE
from searchr1.distributed.reduce import UPDATE
from searchr1.distributed.split import MinibatchShare, global_minibatches
from searchr1.batch.microbatches import pack_ffd
from searchr1.batch.step_batch import Plan, StepBatch
from searchr1.loop.step_scoring import engine_call

SUMMED = ("train/token_count",)
#: losses whose per-token value is linear and positively homogeneous in A, so a per-datum
#: weight on the advantages is a per-datum weight on the loss (dro's β-term is not)
SCALABLE = ("importance_sampling", "ppo", "cispo")
LAST = ("train/step", "train/lr", "train/learning_rate")
FIRST_ONLY = ("train/logprob_mismatch", "train/entropy")


@dataclass(frozen=True)
class UpdateSettings:
    """What the update needs from ``loss`` and ``trainer``."""

    loss: LossConfig
    minibatch_trajectories: int = 0  # 0 = the whole batch in one optimizer step
    microbatch_trajectories: int = 0  # loss micro-batches (microbatch_token_mean); 0 = one
    max_datums_per_microbatch: int = 32
    max_padded_tokens_per_microbatch: int = 64000
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0

    @classmethod
    def from_configs(cls, loss, trainer) -> "UpdateSettings":
        t = trainer
        return cls(loss, t.minibatch_trajectories, t.microbatch_trajectories,
                   t.max_datums_per_microbatch, t.max_padded_tokens_per_microbatch,
                   t.beta1, t.beta2, t.eps, t.weight_decay, t.grad_clip_norm)

    @property
    def uses_builtin(self) -> bool:
        """Whether pytrio's built-in loss can express the objective (module docstring)."""
        kl_in_loss = self.loss.kl.coef > 0 and self.loss.kl.placement == KLPlacement.loss
        token_mean = Aggregation(self.loss.aggregation) is Aggregation.token_mean
        return (not self.loss.entropy_coef and not kl_in_loss
                and (token_mean or self.loss.name in SCALABLE))

    @property
    def first_minibatch_on_policy(self) -> bool:
        """Whether mini-batch 0 takes its ratio baseline from its own forward (verl's on-policy rule).

        With ``loss.old_logprobs=recompute`` the baseline is the trainer's log-prob under the
        weights of the rollout, and mini-batch 0 is trained under exactly those weights, so
        its old log-probs are its current ones, detached (verl's ``on_policy`` case, for the
        first mini-batch only): the recompute pass scores the later mini-batches alone. It
        needs the custom objective (a built-in loss reads the baseline from the datums) and
        KL outside the reward (a KL penalty needs every old log-prob before the advantages).
        """
        kl_in_reward = self.loss.kl.coef > 0 and self.loss.kl.placement == KLPlacement.reward
        return (OldLogprobs(self.loss.old_logprobs) is OldLogprobs.recompute
                and not self.uses_builtin and not kl_in_reward)


def minibatches(n: int, size: int) -> list[list[int]]:
    """Contiguous mini-batches of ``size`` datums (the last may be smaller); 0 = one."""
    if size < 0:
        raise ValueError("trainer.minibatch_trajectories must be >= 0")
    size = size or n or 1
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def plan_update(lengths_D, s: UpdateSettings, shares: list[MinibatchShare] | None = None) -> Plan:
    """This rank's part of every mini-batch and, within each, its FFD micro-batches (once).

    ``shares``: this rank's share of each global mini-batch (``dp.minibatches``); default
    the one-process mini-batches of the batch. Sending a share bin after bin makes the
    local engine's sequential chunker cut exactly these bins; the same bins give the
    step's ``train/*`` size metrics.
    """
    lengths = [int(n) for n in lengths_D]
    if shares is None:
        shares = global_minibatches([len(lengths)], 0, s.minibatch_trajectories)
    bins = [[[sh.local[j] for j in b] for b in pack_ffd([lengths[i] for i in sh.local],
                                                        s.max_datums_per_microbatch,
                                                        s.max_padded_tokens_per_microbatch)]
            if sh.local else [] for sh in shares]
    return Plan([list(sh.local) for sh in shares], bins, list(shares))


def _adam(s: UpdateSettings, lr: float) -> pytrio.AdamParams:
    return pytrio.AdamParams(learning_rate=lr, beta1=s.beta1, beta2=s.beta2, eps=s.eps,
                             weight_decay=s.weight_decay, grad_clip_norm=s.grad_clip_norm)


def domain_tokens(s: UpdateSettings, batch: StepBatch, d: int) -> float:
    """Tokens of datum ``d`` that carry loss: action tokens (dro: those with A ≠ 0)."""
    domain = batch.row("mask_T", d) > 0
    if s.loss.name == "dro":
        domain &= batch.row("advantages_T", d) != 0
    return float(domain.sum())


def minibatch_totals(dp, s: UpdateSettings, batch: StepBatch, share, step_counts) -> GlobalTotals:
    """The ``GlobalTotals`` of this rank's ``share`` (``losses.aggregation.global_totals``:
    one all-reduce of a short vector).

    ``step_counts`` = (trajectories sampled, datums) of the step over all ranks.
    """
    micro_size = s.microbatch_trajectories or share.size or 1
    n_traj, n_datums = step_counts
    n_seq = max(share.size * n_traj / max(n_datums, 1), 1.0)
    tokens = [domain_tokens(s, batch, i) for i in share.local]
    return global_totals(tokens, micro_size, n_seq, share.offset, share.size, dp.all_sum)


def objective(s: UpdateSettings, batch: StepBatch, part: list[int], sent: list[int],
              g: GlobalTotals | None = None, on_policy: bool = False):
    """The custom-loss closure over the datums ``sent`` (a permutation of ``part``).

    ``on_policy``: the ratio baseline is the call's own log-probs, detached (the ratio is 1
    in value and its gradient that of the log-prob), not the ``old_T`` column.
    """
    loss, g = s.loss, g or local_totals(s, batch, part)
    pos = {d: g.offset + k for k, d in enumerate(part)}
    kl_in_loss = loss.kl if loss.kl.placement == KLPlacement.loss and loss.kl.coef > 0 else None
    spec = ObjectiveSpec(loss.name, dict(loss_fn_config(loss.name, loss.clip_low, loss.clip_high,
                                                        loss.dro_beta) or {}),
                         Aggregation(loss.aggregation), loss.entropy_coef, kl_in_loss,
                         n_seq=g.n_seq, n_micro=g.n_micro, tokens=g.tokens,
                         micro_tokens=g.micro_tokens)
    col = lambda name: [torch.as_tensor(r) for r in batch.rows(name, sent)]
    q_D, adv_D, mask_D = col("old_T"), col("advantages_T"), col("mask_T")
    micro_D = [g.micro_of(pos[i]) for i in sent]
    ref_D = col("ref_T") if kl_in_loss else None

    exact = bool(loss.entropy_coef) and getattr(loss.entropy, "value", loss.entropy) == "exact"

    def loss_fn(data, logprobs_D, *, entropy_D=None):
        if exact and entropy_D is None:  # an engine without the exact entropy (start-up checks it)
            raise RuntimeError("loss.entropy=exact needs engine=local; set loss.entropy=sampled")
        q = [lp.detach() for lp in logprobs_D] if on_policy else q_D
        return actor_objective(spec, list(logprobs_D), q, adv_D, mask_D, micro_D, ref_D,
                               list(entropy_D) if exact else None)

    def part(indices, logprobs_D, entropy_D=None):
        if exact and entropy_D is None:
            raise RuntimeError("loss.entropy=exact needs engine=local; set loss.entropy=sampled")
        pick = lambda xs: None if xs is None else [xs[i] for i in indices]
        q = [lp.detach() for lp in logprobs_D] if on_policy else pick(q_D)
        return objective_sums(spec, list(logprobs_D), q, pick(adv_D), pick(mask_D),
                              pick(micro_D), pick(ref_D), list(entropy_D) if exact else None)

    loss_fn.wants_entropy = exact  # the local engine then passes entropy_D (forward_backward.py)
    loss_fn.separable = SeparableObjective(part)  # a sum over datums: one pass per micro-batch
    return loss_fn


def call_weights(s: UpdateSettings, batch: StepBatch, part: list[int],
                 g: GlobalTotals | None = None) -> dict[int, float]:
    """Each datum's advantage weight in a built-in loss's call over ``part``
    (``losses.aggregation.datum_weights`` of their loss-domain tokens; ``g`` default: ``part``
    is the whole mini-batch)."""
    g = g or local_totals(s, batch, part)
    return dict(zip(part, datum_weights(s.loss.aggregation, [domain_tokens(s, batch, i) for i in part], g)))


def fill_old_rows(batch: StepBatch, sent: list[int], outputs) -> None:
    """``old_T`` of the datums ``sent`` from a call's log-prob outputs (0 off the mask)."""
    for i, o in zip(sent, outputs):
        batch.row("old_T", i)[:] = batch.call_logprobs(i, o)


def _mismatch(batch: StepBatch, sent: list[int], outputs) -> dict[str, float]:
    """Sampler vs trainer log-probs on the tokens just trained (before this update)."""
    q_all, p_all = [], []
    for i, out in zip(sent, outputs):
        m = batch.row("mask_T", i) > 0
        p = batch.call_logprobs(i, out, masked=False)
        q_all.append(batch.row("sampler_T", i)[m])
        p_all.append(p[m])
    q, p = np.concatenate(q_all), np.concatenate(p_all)
    if q.size == 0:
        return {}
    return {"train/logprob_mismatch": float(np.mean(q - p)),
            "train/logprob_mismatch_abs": float(np.mean(np.abs(q - p))),
            "train/entropy": float(-np.mean(q))}


def local_totals(s: UpdateSettings, batch: StepBatch, part: list[int]) -> GlobalTotals:
    """``GlobalTotals`` of ``part`` as the whole mini-batch (one process)."""
    counts = (batch.n_trajectories, batch.size)
    return minibatch_totals(SINGLE, s, batch, MinibatchShare(list(part), 0, len(part)), counts)


@dataclass(frozen=True)
class Submitted:
    """Mini-batch ``k``'s engine calls, queued and not yet awaited (``submit_minibatch``)."""

    batch: StepBatch
    sent: list[int]  # the datums, in send order
    lr: float
    fb: APIFuture | None  # None: an empty share (no forward_backward of its own)
    opt: APIFuture
    on_policy: bool = False


def submit_minibatch(client, batch: StepBatch, k: int, s: UpdateSettings, lr: float,
                     totals: GlobalTotals | None = None, data_parallel: bool = False,
                     on_policy: bool = False) -> Submitted:
    """Queue forward_backward (built-in or custom) on mini-batch ``k`` of ``batch.plan``, then
    its optim_step, without waiting for either; Datums are made here, in the plan's send order.

    ``on_policy`` (mini-batch 0 under ``UpdateSettings.first_minibatch_on_policy``): the
    custom objective's baseline is the call's own log-probs, which then fill these datums'
    ``old_T`` rows (0 off the mask, as the recompute pass leaves them) in ``collect_minibatch``.

    ``totals``: the global mini-batch's counts (default: this share is the whole mini-batch).
    Under data parallelism a rank with an empty share still takes the optimizer step (its
    gradients are the others' after the all-reduce), and a built-in loss whose value is
    not linear in A (dro) goes through the custom objective, which takes global totals.
    """
    part, sent = batch.plan.minibatches[k], batch.plan.sent(k)
    g = totals or local_totals(s, batch, part)
    fb = None
    if part:
        if s.uses_builtin and (not data_parallel or s.loss.name in SCALABLE):
            l, w = s.loss, call_weights(s, batch, part, g)
            data = batch.datums(sent, [w[i] for i in sent])
            fb = client.forward_backward(data, l.name, loss_fn_config(l.name, l.clip_low, l.clip_high, l.dro_beta))
        else:
            fb = client.forward_backward_custom(batch.datums(sent), objective(s, batch, part, sent, g, on_policy))
    elif data_parallel and client.capabilities.sharded_state:
        client.forward_backward_idle()  # FSDP2: the others' passes are collectives
    return Submitted(batch, sent, lr, fb, client.optim_step(_adam(s, lr)), on_policy)


def collect_minibatch(sub: Submitted) -> dict:
    """Await a submitted mini-batch's results, in submission order, and make its metrics."""
    out: dict[str, float] = {}
    if sub.fb is not None:
        fb = sub.fb.result()
        if sub.on_policy:
            fill_old_rows(sub.batch, sub.sent, fb.loss_fn_outputs)
        out = {f"train/{k.split(':')[0]}": float(v) for k, v in fb.metrics.items()}
        out["train/loss"] = float(fb.metrics.get("loss_mean", fb.metrics.get("loss:mean", 0.0)))
        out.update(_mismatch(sub.batch, sub.sent, fb.loss_fn_outputs))
    opt = sub.opt.result()
    out["train/lr"] = sub.lr
    out.update({f"train/{k}": float(v) for k, v in opt.metrics.items()})
    return out


async def update_stage(client, batch: StepBatch, s: UpdateSettings, dp, lr_at, optimizer_step: int,
                       critic=None, offload: bool = False, fused: bool = False) -> list[dict]:
    """One optimizer step per global mini-batch of ``batch.plan`` (and the critic's, with a
    critic: ``advantages.critic.update_critic``); each mini-batch's metrics, reduced over the ranks.

    Each share's loss is normalised by its global mini-batch's totals. Pipelined (module
    docstring): mini-batch k's calls, then its critic step, run before mini-batch k-1's
    results are awaited. ``fused``: mini-batch 0 scores its own ratio baseline.
    """
    step_counts = dp.all_sum([float(batch.n_trajectories), float(batch.size)])
    per_mb, queued = [], None
    for k, share in enumerate(batch.plan.shares):
        totals = minibatch_totals(dp, s, batch, share, step_counts)
        calls = await engine_call(offload, submit_minibatch, client, batch, k, s,
                                  lr_at(optimizer_step + k), totals, dp.active, fused and k == 0)
        critic_m = {}
        if critic is not None:
            critic_m = await engine_call(offload, update_critic, critic, critic_batch(batch, share.local),
                                         getattr(lr_at, "step", None), share, dp)
        if queued is not None:
            per_mb.append(await _collect(s, dp, *queued, offload))
        queued = (calls, critic_m, share)
    if queued is not None:
        per_mb.append(await _collect(s, dp, *queued, offload))
    return per_mb


async def _collect(s: UpdateSettings, dp, calls: Submitted, critic_m: dict, share, offload: bool) -> dict:
    """A submitted mini-batch's metrics (with its critic step's), reduced over the ranks."""
    m = await engine_call(offload, collect_minibatch, calls)
    m.update(critic_m)
    tokens = sum(domain_tokens(s, calls.batch, i) for i in share.local)
    return dp.reduce_metrics(m, {"tokens": tokens}, UPDATE)


def combine(per_minibatch: list[dict[str, float]]) -> dict[str, float]:
    """Sum counters, keep the last step/LR, first-only on-policy keys, average the rest."""
    out: dict[str, float] = {}
    keys = {k for m in per_minibatch for k in m}
    for key in keys:
        vals = [m[key] for m in per_minibatch if key in m]
        if key.startswith(SUMMED):
            out[key] = float(sum(vals))
        elif key in LAST:
            out[key] = vals[-1]
        elif key.startswith(FIRST_ONLY):
            out[key] = per_minibatch[0].get(key, vals[0])
        else:
            out[key] = float(np.mean(vals))
    return out
