"""LEGACY (kept only for ``tests/test_trio_engine.py``; the step uses ``searchr1/loop/update.py``).

The update of one mini-batch through the PyTRIO client API, and its KL plumbing.

``run_update`` sends one ``forward_backward`` (built-in loss) or, when the KL term goes into
the loss, one ``forward_backward_custom`` whose closure adds ``kl_loss_term`` to the same
policy loss; then one ``optim_step``. It returns ``train/*`` metrics, including the
sampler-vs-trainer logprob mismatch measured on the tokens just trained.
"""

from __future__ import annotations

import numpy as np
import pytrio
import torch

from searchr1.losses.kl import kl_loss_term, kl_penalty_advantages
from searchr1.losses.policy import POLICY_LOSSES, finalize_metrics, loss_fn_config


def kl_reward_adjust(batch, ref_D: list[np.ndarray], coef: float, estimator: str) -> None:
    """KL in the reward: advantages −= coef·KL(sampler ‖ ref) on action tokens, in place."""
    for i, arrays in enumerate(batch.arrays_D):
        adv = kl_penalty_advantages(
            torch.as_tensor(arrays["advantages"]),
            torch.as_tensor(arrays["logprobs"]),
            torch.as_tensor(ref_D[i]),
            torch.as_tensor(arrays["mask"]),
            coef,
            estimator,
        ).numpy()
        arrays["advantages"] = adv
        batch.datums_D[i].loss_fn_inputs["advantages"] = pytrio.types.TensorData.from_numpy(
            adv.astype(np.float32)
        )


def _kl_loss_closure(name: str, scalars: dict, ref_T: list[torch.Tensor], kl) -> callable:
    """A pytrio custom loss: the built-in policy loss plus coef·KL (token-mean over actions).

    Non-action targets are −100 in our datums (``rollout/datum.py``), so "active" tokens are
    exactly the action tokens of this mini-batch, as in the built-in path.
    """
    spec = POLICY_LOSSES.get(name)

    def loss_fn(data: list[pytrio.Datum], logprobs: list[torch.Tensor]):
        cols = {k: [] for k in ("q", "adv", "w", "ref")}
        for d, ref in zip(data, ref_T):
            tgt = torch.as_tensor(d.loss_fn_inputs["target_tokens"].to_numpy())
            cols["q"].append(torch.as_tensor(d.loss_fn_inputs["logprobs"].to_numpy(), dtype=torch.float32))
            cols["adv"].append(torch.as_tensor(d.loss_fn_inputs["advantages"].to_numpy(), dtype=torch.float32))
            cols["w"].append((tgt != -100).float())
            cols["ref"].append(ref.float())
        lp = torch.cat([x.float() for x in logprobs])
        q, adv, w, ref = (torch.cat(cols[k]).to(lp.device) for k in ("q", "adv", "w", "ref"))
        # same denominators as the built-in losses: action tokens (targets ≠ −100), or for
        # dro the tokens that also carry advantage
        domain = w if spec.denominator == "total_active_tokens" else w * (adv != 0)
        denom = max(float(domain.sum()), 1.0)
        loss, sums = spec.fn(lp, q, adv, w, denom, **scalars)
        kl_term = kl_loss_term(lp, ref, w, kl.coef, kl.estimator, max(float(w.sum()), 1.0))
        metrics = finalize_metrics(sums)
        metrics["kl_loss"] = float(kl_term.detach())
        return loss + kl_term, metrics

    return loss_fn


def _mismatch(batch, idx: list[int], outputs) -> dict[str, float]:
    """Sampler vs trainer logprobs on the same action tokens (before this update).

    ``train/logprob_mismatch`` is the k1 estimate E_q[log q − log p]; ``train/entropy`` is
    the Monte-Carlo entropy estimate −E_q[log q] of the sampling policy.
    """
    q_all, p_all = [], []
    for i, out in zip(idx, outputs):
        m = batch.arrays_D[i]["mask"] > 0
        p = np.asarray(out["logprobs"].tolist(), dtype=np.float64)[: len(m)]
        q_all.append(batch.arrays_D[i]["logprobs"][m])
        p_all.append(p[m])
    q, p = np.concatenate(q_all), np.concatenate(p_all)
    if q.size == 0:
        return {}
    return {
        "train/logprob_mismatch": float(np.mean(q - p)),
        "train/logprob_mismatch_abs": float(np.mean(np.abs(q - p))),
        "train/entropy": float(-np.mean(q)),
    }


def run_update(client, batch, idx: list[int], ref_D, cfg, lr: float) -> dict[str, float]:
    """forward_backward (or custom, for KL in the loss) on ``idx``, then one optim_step."""
    lcfg, tcfg = cfg.loss, cfg.trainer
    fn_cfg = loss_fn_config(lcfg.name, lcfg.clip_low, lcfg.clip_high, lcfg.dro_beta)
    data = [batch.datums_D[i] for i in idx]
    if ref_D is not None and lcfg.kl.placement == "loss":
        ref_T = [torch.as_tensor(ref_D[i]) for i in idx]
        closure = _kl_loss_closure(lcfg.name, dict(fn_cfg or {}), ref_T, lcfg.kl)
        fb = client.forward_backward_custom(data, closure).result()
    else:
        fb = client.forward_backward(data, lcfg.name, fn_cfg).result()
    adam = pytrio.AdamParams(
        learning_rate=lr, beta1=tcfg.beta1, beta2=tcfg.beta2, eps=tcfg.eps,
        weight_decay=tcfg.weight_decay, grad_clip_norm=tcfg.grad_clip_norm,
    )
    opt = client.optim_step(adam).result()
    out = {f"train/{k.split(':')[0]}": float(v) for k, v in fb.metrics.items()}
    out["train/loss"] = float(fb.metrics.get("loss_mean", fb.metrics.get("loss:mean", 0.0)))
    out["train/kl"] = float(fb.metrics.get("kl_loss", 0.0))
    out["train/lr"] = lr
    out.update({f"train/{k}": float(v) for k, v in opt.metrics.items()})
    out.update(_mismatch(batch, idx, fb.loss_fn_outputs))
    return out

