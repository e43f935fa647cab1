"""The batched decode loop and batched prompt scoring behind ``LocalSamplingClient``.

All rows of a batch share forward passes: prompts are left-padded to a common length
(attention mask 0 on padding, position ids counted from each row's first real token),
prefilled once, then decoded one token per step with a ``DynamicCache``. Rows finish
independently (stop token, stop string, EOS or ``max_tokens``); a finished row keeps
riding along until at most half the batch is still live, then the batch — KV cache
included — is compacted to the live rows, so stragglers stop paying for finished rows.

Shapes: ``_B`` rows, ``_L`` padded length, ``_V`` vocabulary, ``_H`` hidden size.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from searchr1.engines.local.sampling.token_select import RowSampling, pick_tokens, raw_logprobs

STOP = "stop"  # a stop token, a stop string or EOS ended the sequence
LENGTH = "length"  # the sequence reached max_tokens


@dataclass(frozen=True)
class StopCriteria:
    """When a row stops: on a stop token id (EOS included) or a completed stop string.

    Stop strings are matched on the decoded text of the last few generated tokens (enough
    for the longest stop string even at one byte per token), so the check costs O(1) per
    step instead of re-decoding the whole generation.
    """

    token_ids: frozenset[int] = frozenset()
    strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def hit(self, tokens: list[int]) -> bool:
        """Whether the last token of ``tokens`` ends the sequence."""
        if tokens[-1] in self.token_ids:
            return True
        if not self.strings or self.decode is None:
            return False
        window = 4 * max(len(s) for s in self.strings) + 4
        text = self.decode(tokens[-window:])
        return any(s in text for s in self.strings)


@dataclass
class Row:
    """One sequence being decoded: its prompt, parameters, generator and output so far."""

    prompt: list[int]
    sampling: RowSampling
    max_tokens: int
    stop: StopCriteria
    generator: torch.Generator  # CPU generator: one uniform per step, batch-independent
    seed: int = 0  # the sequence's own 63-bit seed (the slot sampler's counter-based RNG)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def push(self, token: int, logprob: float) -> None:
        """Append a sampled token; mark the row done when it hits a stop or the length cap."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if self.stop.hit(self.tokens):
            self.stop_reason = STOP
        elif len(self.tokens) >= self.max_tokens:
            self.stop_reason = LENGTH


@dataclass
class PromptScores:
    """Per prompt token logprob (first is None) and optional top-k alternatives."""

    logprobs: list[float | None]
    topk: list[list[tuple[int, float]] | None] = field(default_factory=list)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts into ``(input_ids_BL, attention_mask_BL, position_ids_BL)``."""
    length = max(len(p) for p in prompts)
    ids_BL = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(prompts), length), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids_BL[b, length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask_BL[b, length - len(prompt) :] = 1
    positions_BL = (mask_BL.cumsum(dim=-1) - 1).clamp_min(0)
    return ids_BL.to(device), mask_BL.to(device), positions_BL.to(device)


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name under which the model's ``forward`` takes the KV cache.

    transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns, and
    goes in 5.40); an unknown name would be swallowed by ``**kwargs`` and silently
    decode without history, so ask the (peft-unwrapped) model's signature.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's (first) parameters; works for peft wrappers too."""
    return next(model.parameters()).device


@torch.inference_mode()
def decode_rows(model: torch.nn.Module, rows: list[Row], pad_id: int) -> int:
    """Decode all ``rows`` together until each is done; returns the forward-pass count."""
    ids_BL, mask_BL, positions_BL = left_pad([r.prompt for r in rows], pad_id, model_device(model))
    logits_BV, cache_args = _prefill(model, ids_BL, mask_BL, positions_BL)
    cache = next(iter(cache_args.values()))
    live = list(range(len(rows)))  # batch position -> row index
    passes = 1
    while True:
        next_B = _advance([rows[i] for i in live], logits_BV)
        keep = [j for j, i in enumerate(live) if not rows[i].done]
        if not keep:
            return passes
        if len(keep) <= len(live) // 2:
            index = torch.tensor(keep, device=ids_BL.device)
            cache.batch_select_indices(index)
            mask_BL, positions_BL, next_B = mask_BL[index], positions_BL[index], next_B[index]
            live = [live[j] for j in keep]
        mask_BL = torch.cat([mask_BL, mask_BL.new_ones(len(live), 1)], dim=-1)
        positions_BL = positions_BL[:, -1:] + 1
        logits_BV = _forward(model, next_B[:, None], mask_BL, positions_BL, cache_args)
        passes += 1


def _prefill(
    model: torch.nn.Module, ids_BL: torch.Tensor, mask_BL: torch.Tensor, positions_BL: torch.Tensor
) -> tuple[torch.Tensor, dict[str, DynamicCache]]:
    """Run the prompts through a fresh KV cache; returns last logits and the cache kwargs."""
    cache = DynamicCache(config=getattr(model, "config", None))
    cache_args = {cache_kwarg(model): cache}
    logits_BV = _forward(model, ids_BL, mask_BL, positions_BL, cache_args)
    if cache.get_seq_length() != ids_BL.shape[1]:
        name = next(iter(cache_args))
        raise RuntimeError(f"{type(model).__name__} ignored the KV cache passed as {name!r}")
    return logits_BV, cache_args


def _forward(
    model: torch.nn.Module,
    ids_BL: torch.Tensor,
    mask_BL: torch.Tensor,
    positions_BL: torch.Tensor,
    cache: dict[str, DynamicCache],
) -> torch.Tensor:
    """One cached forward pass; returns the last position's logits ``[B, V]``."""
    out = model(
        input_ids=ids_BL,
        attention_mask=mask_BL,
        position_ids=positions_BL,
        use_cache=True,
        logits_to_keep=1,
        **cache,
    )
    return out.logits[:, -1]


def _advance(batch: list[Row], logits_BV: torch.Tensor) -> torch.Tensor:
    """Pick and record one token for every live row; returns the picked tokens ``[B]``.

    Every row draws its uniform (finished rows too, harmlessly) so the draw count per
    generator is one per step of that row, whatever else is in the batch.
    """
    uniforms_B = torch.stack([torch.rand((), generator=r.generator) for r in batch])
    tokens_B = pick_tokens(logits_BV, [r.sampling for r in batch], uniforms_B)
    logprobs_B = raw_logprobs(logits_BV, tokens_B)
    for row, token, logprob in zip(batch, tokens_B.tolist(), logprobs_B.tolist(), strict=True):
        if not row.done:
            row.push(token, logprob)
    return tokens_B


@torch.inference_mode()
def score_prompts(
    model: torch.nn.Module,
    prompts: list[list[int]],
    pad_id: int,
    topk: int = 0,
    chunk: int = 512,
) -> list[PromptScores]:
    """Logprob of every prompt token given its prefix, for a batch of prompts.

    Runs the decoder once over the padded batch, then projects hidden states to the
    vocabulary ``chunk`` positions at a time, so memory stays O(chunk × V) rather than
    O(B × L × V) for long prompts and large vocabularies.
    """
    ids_BL, mask_BL, positions_BL = left_pad(prompts, pad_id, model_device(model))
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    hidden_BLH = decoder(
        input_ids=ids_BL, attention_mask=mask_BL, position_ids=positions_BL, use_cache=False
    ).last_hidden_state
    length = ids_BL.shape[1]
    scores = []
    for b, prompt in enumerate(prompts):
        hidden_TH = hidden_BLH[b, length - len(prompt) : length - 1]
        targets_T = ids_BL[b, length - len(prompt) + 1 :]
        scores.append(_score_one(head, hidden_TH, targets_T, topk, chunk))
    return scores


def _score_one(
    head: torch.nn.Module, hidden_TH: torch.Tensor, targets_T: torch.Tensor, topk: int, chunk: int
) -> PromptScores:
    """Chunked log-softmax over one prompt's positions; position 0 has no prefix → None."""
    scores = PromptScores(logprobs=[None], topk=[None] if topk > 0 else [])
    for start in range(0, hidden_TH.shape[0], chunk):
        logprobs_CV = torch.log_softmax(head(hidden_TH[start : start + chunk]).float(), dim=-1)
        picked_C = logprobs_CV.gather(-1, targets_T[start : start + chunk, None]).squeeze(-1)
        scores.logprobs.extend(picked_C.tolist())
        if topk > 0:
            values_CK, index_CK = logprobs_CV.topk(topk, dim=-1)
            for ids, vals in zip(index_CK.tolist(), values_CK.tolist(), strict=True):
                scores.topk.append(list(zip(ids, vals, strict=True)))
    return scores
