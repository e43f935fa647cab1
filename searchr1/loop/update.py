"""The update stage: datums built once → one or several optimizer steps (+ the critic's).

Takes its own settings (``UpdateSettings``: a slice of ``loss`` and ``trainer``), not the
root config, and talks to the engine only through the PyTRIO client API.

Mini-batches: ``trainer.minibatch_trajectories`` datums per optimizer step, contiguous, so
each datum is trained exactly once per rollout (verl's ``ppo_epochs=1`` and
``batch.split(ppo_mini_batch_size)``; 2,560 trajectories / 256 = 10 steps). Within a
mini-batch, datums are sent in first-fit-decreasing order (``ffd_order``) so the local
engine's chunker cuts exactly the packed micro-batches; the *loss* micro-batches of
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
what keeps ``experiment=lab`` on pytrio's built-in importance_sampling. Otherwise (entropy
bonus, KL in the loss, dro with a non-token-mean aggregation) ``forward_backward_custom``
with ``losses.objective.actor_objective``.

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
import torch

from searchr1.losses.config import Aggregation, KLPlacement, LossConfig
from searchr1.losses.objective import ObjectiveSpec, actor_objective
from searchr1.losses.policy import loss_fn_config
from searchr1.loop.microbatches import pack_ffd
from searchr1.rollout.datum import to_datum

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


@dataclass
class TrainBatch:
    """The datums of one step, built once, with the arrays they were built from."""

    datums_D: list[pytrio.Datum]
    arrays_D: list[dict[str, np.ndarray]]  # shifted: mask, logprobs (ratio baseline), advantages…
    ref_D: list[np.ndarray] | None = None  # reference log-probs (KL in the loss)
    n_trajectories: int = 0  # trajectories sampled for these datums (incl. dropped ones)


def minibatches(n: int, size: int) -> list[list[int]]:
    """Contiguous mini-batches of ``size`` datums (the last may be smaller); 0 = one."""
    if size < 0:
        raise ValueError("trainer.minibatch_trajectories must be >= 0")
    size = size or n or 1
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def ffd_order(lengths: list[int], idx: list[int], max_datums: int, max_padded: int) -> list[int]:
    """``idx`` reordered so the engine's sequential chunker yields FFD micro-batches."""
    bins = pack_ffd([lengths[i] for i in idx], max_datums, max_padded)
    return [idx[j] for b in bins for j in b]


def _adam(s: UpdateSettings, lr: float) -> pytrio.AdamParams:
    return pytrio.AdamParams(learning_rate=lr, beta1=s.beta1, beta2=s.beta2, eps=s.eps,
                             weight_decay=s.weight_decay, grad_clip_norm=s.grad_clip_norm)


def _objective(s: UpdateSettings, batch: TrainBatch, part: list[int], sent: list[int]):
    """The custom-loss closure over the datums ``sent`` (a permutation of ``part``)."""
    loss = s.loss
    micro_size = s.microbatch_trajectories or len(part)
    pos = {d: k for k, d in enumerate(part)}
    n_seq = len(part) * batch.n_trajectories / max(len(batch.datums_D), 1)
    kl_in_loss = loss.kl if loss.kl.placement == KLPlacement.loss and loss.kl.coef > 0 else None
    spec = ObjectiveSpec(loss.name, dict(loss_fn_config(loss.name, loss.clip_low, loss.clip_high,
                                                        loss.dro_beta) or {}),
                         Aggregation(loss.aggregation), loss.entropy_coef, kl_in_loss,
                         n_seq=max(n_seq, 1.0), n_micro=-(-len(part) // micro_size))
    col = lambda key: [torch.as_tensor(batch.arrays_D[i][key]) for i in sent]
    q_D, adv_D, mask_D = col("logprobs"), col("advantages"), col("mask")
    micro_D = [pos[i] // micro_size for i in sent]
    ref_D = [torch.as_tensor(batch.ref_D[i]) for i in sent] if kl_in_loss else None

    def loss_fn(data, logprobs_D):
        return actor_objective(spec, list(logprobs_D), q_D, adv_D, mask_D, micro_D, ref_D)

    return loss_fn


def datum_weights(s: UpdateSettings, batch: TrainBatch, part: list[int]) -> dict[int, float]:
    """w_d that turns a token mean over ``part`` into ``loss.aggregation`` (module docstring)."""
    mode = Aggregation(s.loss.aggregation)
    tokens = {i: float(batch.arrays_D[i]["mask"].sum()) for i in part}
    total = sum(tokens.values()) or 1.0
    if mode is Aggregation.token_mean:
        return {i: 1.0 for i in part}
    if mode is Aggregation.microbatch_token_mean:
        size = s.microbatch_trajectories or len(part)
        groups = [part[k:k + size] for k in range(0, len(part), size)]
        out = {}
        for g in groups:
            n_g = sum(tokens[i] for i in g) or 1.0
            out.update({i: total / (len(groups) * n_g) for i in g})
        return out
    n_seq = max(len(part) * batch.n_trajectories / max(len(batch.datums_D), 1), 1.0)
    if mode is Aggregation.seq_mean_token_sum:
        return {i: total / n_seq for i in part}
    return {i: total / (n_seq * (tokens[i] or 1.0)) for i in part}


def _weighted(s: UpdateSettings, batch: TrainBatch, part, sent, data) -> list:
    """``data`` with advantages × w_d (the datums themselves when every w_d is 1)."""
    w = datum_weights(s, batch, part)
    if all(v == 1.0 for v in w.values()):
        return data
    out = []
    for i, d in zip(sent, data):
        a = dict(batch.arrays_D[i], advantages=batch.arrays_D[i]["advantages"] * w[i])
        out.append(to_datum(a))
    return out


def _mismatch(batch: TrainBatch, sent: list[int], outputs) -> dict[str, float]:
    """Sampler vs trainer log-probs on the tokens just trained (before this update)."""
    q_all, p_all = [], []
    for i, out in zip(sent, outputs):
        m = batch.arrays_D[i]["mask"] > 0
        p = np.asarray(out["logprobs"].tolist(), dtype=np.float64)[: len(m)]
        q_all.append(batch.arrays_D[i]["sampler_logprobs"][m])
        p_all.append(p[m])
    q, p = np.concatenate(q_all), np.concatenate(p_all)
    if q.size == 0:
        return {}
    return {"train/logprob_mismatch": float(np.mean(q - p)),
            "train/logprob_mismatch_abs": float(np.mean(np.abs(q - p))),
            "train/entropy": float(-np.mean(q))}


def update_minibatch(client, batch: TrainBatch, part: list[int], s: UpdateSettings, lr: float) -> dict:
    """forward_backward (built-in or custom) on ``part``, then one optim_step."""
    lengths = [len(a["target_tokens"]) for a in batch.arrays_D]
    sent = ffd_order(lengths, part, s.max_datums_per_microbatch, s.max_padded_tokens_per_microbatch)
    data = [batch.datums_D[i] for i in sent]
    if s.uses_builtin:
        l = s.loss
        data = _weighted(s, batch, part, sent, data)
        fb = client.forward_backward(data, l.name, loss_fn_config(l.name, l.clip_low, l.clip_high, l.dro_beta)).result()
    else:
        fb = client.forward_backward_custom(data, _objective(s, batch, part, sent)).result()
    opt = client.optim_step(_adam(s, lr)).result()
    out = {f"train/{k.split(':')[0]}": float(v) for k, v in fb.metrics.items()}
    out["train/loss"] = float(fb.metrics.get("loss_mean", fb.metrics.get("loss:mean", 0.0)))
    out["train/lr"] = lr
    out.update({f"train/{k}": float(v) for k, v in opt.metrics.items()})
    out.update(_mismatch(batch, sent, fb.loss_fn_outputs))
    return out


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
