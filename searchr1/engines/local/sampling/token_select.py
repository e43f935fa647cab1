"""Per-row next-token selection for the batched decoder: temperature, top-k, top-p.

Every row of a batch carries its own sampling parameters, so the math is vectorised over
rows with per-row tensors. Randomness enters only as one uniform number per row and step,
drawn by the caller from that row's own ``torch.Generator``; the token is found by
inverse-CDF lookup. A row's choice therefore depends on its own logits and its own
generator, never on which other rows share the batch (up to float noise in the logits).

Shapes: ``_B`` rows of the batch, ``_V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSampling:
    """Sampling parameters of one row; ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_k: int = -1  # <= 0 disables top-k
    top_p: float = 1.0  # 1.0 disables nucleus filtering

    @property
    def filtered(self) -> bool:
        """Whether top-k or top-p actually truncates the distribution."""
        return self.top_k > 0 or self.top_p < 1.0


def raw_logprobs(logits_BV: torch.Tensor, tokens_B: torch.Tensor) -> torch.Tensor:
    """Log-softmax of the raw logits (temperature 1, no truncation) at ``tokens_B``.

    This is the distribution a trainer computes from the same model, so sampler and
    trainer logprobs differ only by numerics, not by sampling settings.
    """
    logprobs_BV = torch.log_softmax(logits_BV.float(), dim=-1)
    return logprobs_BV.gather(-1, tokens_B[:, None]).squeeze(-1)


def pick_tokens(
    logits_BV: torch.Tensor, params_B: list[RowSampling], uniforms_B: torch.Tensor
) -> torch.Tensor:
    """Choose one token per row: greedy rows take the argmax, the rest sample.

    ``uniforms_B`` are per-row draws in [0, 1) from each row's generator; they are
    consumed even by greedy rows so a row's random stream never depends on its params.
    """
    logits_BV = logits_BV.float()
    uniforms_B = uniforms_B.to(logits_BV.device)  # drawn on CPU generators, used beside logits
    tokens_B = logits_BV.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params_B) if p.temperature > 0]
    if not sampled:
        return tokens_B
    plain = [i for i in sampled if not params_B[i].filtered]
    filtered = [i for i in sampled if params_B[i].filtered]
    for rows, pick in ((plain, _sample_plain), (filtered, _sample_filtered)):
        if rows:
            index = torch.tensor(rows, device=logits_BV.device)
            picked = pick(logits_BV[index], [params_B[i] for i in rows], uniforms_B[index])
            tokens_B[index] = picked
    return tokens_B


def _temperatures(params: list[RowSampling], device: torch.device) -> torch.Tensor:
    """Column of the rows' temperatures, shaped to divide ``[rows, V]`` logits."""
    return torch.tensor([p.temperature for p in params], device=device)[:, None]


def _inverse_cdf(probs_RV: torch.Tensor, uniforms_R: torch.Tensor) -> torch.Tensor:
    """Index of the first position whose cumulative mass exceeds ``u`` × total mass.

    ``right=True`` never lands on a zero-probability position; the clamp guards the
    last position against cumulative rounding.
    """
    cdf_RV = probs_RV.cumsum(dim=-1)
    targets_R1 = (uniforms_R * cdf_RV[:, -1])[:, None]
    index_R = torch.searchsorted(cdf_RV, targets_R1, right=True).squeeze(-1)
    return index_R.clamp_(max=probs_RV.shape[-1] - 1)


def _sample_plain(
    logits_RV: torch.Tensor, params: list[RowSampling], uniforms_R: torch.Tensor
) -> torch.Tensor:
    """Sample from softmax(logits / T) over the whole vocabulary (no sort needed)."""
    probs_RV = torch.softmax(logits_RV / _temperatures(params, logits_RV.device), dim=-1)
    return _inverse_cdf(probs_RV, uniforms_R.to(logits_RV.device))


def _sample_filtered(
    logits_RV: torch.Tensor, params: list[RowSampling], uniforms_R: torch.Tensor
) -> torch.Tensor:
    """Sample after top-k then top-p truncation, working in descending-logit order.

    Top-p keeps the smallest prefix whose mass reaches ``top_p`` (the top token always
    survives), as in vLLM and HF ``generate``.
    """
    device = logits_RV.device
    sorted_RV, order_RV = torch.sort(logits_RV, dim=-1, descending=True)
    vocab = sorted_RV.shape[-1]
    ranks_V = torch.arange(vocab, device=device)
    top_k_R = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    sorted_RV = sorted_RV.masked_fill(ranks_V[None, :] >= top_k_R[:, None], float("-inf"))
    probs_RV = torch.softmax(sorted_RV / _temperatures(params, device), dim=-1)
    mass_before_RV = probs_RV.cumsum(dim=-1) - probs_RV
    top_p_R1 = torch.tensor([p.top_p for p in params], device=device)[:, None]
    probs_RV = probs_RV.masked_fill(mass_before_RV >= top_p_R1, 0.0)
    index_R = _inverse_cdf(probs_RV, uniforms_R.to(device))
    return order_RV.gather(-1, index_R[:, None]).squeeze(-1)
