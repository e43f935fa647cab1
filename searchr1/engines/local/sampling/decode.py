"""The batched decode loop and batched prompt scoring behind ``LocalSamplingClient``.

All rows of a batch share forward passes: prompts are left-padded to a common length
(attention mask 0 on padding, position ids counted from each row's first real token),
prefilled once, then decoded one token per step with a ``DynamicCache``. Rows finish
independently (stop token, stop string, EOS or ``max_tokens``); a finished row keeps
riding along until at most half the batch is still live, then the batch — KV cache
included — is compacted to the live rows, so stragglers stop paying for finished rows.
With a ``PrefixStore`` a row prefills only what its stored prefix lacks (``kv_reuse.py``), and
rows sharing a prompt with nothing stored are prefilled once and copied.

Shapes: ``_B`` rows, ``_L`` padded length, ``_V`` vocabulary, ``_H`` hidden size.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from searchr1.engines.local.sampling.kv_reuse import reuse_layout, store_rows
from searchr1.engines.local.sampling.prefix_store import PrefixStore
from searchr1.engines.local.sampling.select import RowSampling, row_tensors, select
from searchr1.engines.local.sampling.stops import StopRule

#: prompt tokens per prefill forward, summed over the batch (see ``_prefill``)
PREFILL_TOKENS = 2048
PREFILL_MIN_CHUNK = 64


@dataclass
class Row:
    """One sequence being decoded: its prompt, parameters, seed and output so far."""

    prompt: list[int]
    sampling: RowSampling
    stop: StopRule  # carries max_tokens
    seed: int = 0  # the sequence's own 63-bit seed (``select``'s counter-based draws)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def push(self, token: int, logprob: float) -> None:
        """Append a sampled token; mark the row done when its stop rule ends it here."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        ending = self.stop.check(self.tokens)
        if ending is not None:
            self.stop_reason = ending.reason


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
def decode_rows(model: torch.nn.Module, rows: list[Row], pad_id: int, vocab_limit: int = 0,
                store: PrefixStore | None = None, on_step: Callable[[int], None] | None = None) -> int:
    """Decode all ``rows`` together until each is done; returns the forward-pass count.

    ``on_step(n)`` hears of the ``n`` tokens each step picked (progress bars count them).

    ``vocab_limit`` > 0 picks ids below it only (the tokenizer's length; see ``select``).
    With a ``store``, rows start from the stored prefixes of their prompts and leave their
    sequences there (``prefix_store.py``); rows with the same prompt and no stored prefix
    (a group's first turn) are prefilled once and copied.
    """
    device = model_device(model)
    reused = [store.take(r.prompt) if store is not None else (0, None) for r in rows]
    unique, copies = _distinct(rows, reused)
    ids_BS, mask_BL, positions_BS, cache = reuse_layout(
        [rows[u].prompt for u in unique], [reused[u] for u in unique], pad_id, device,
        getattr(model, "config", None))
    logits_BV, cache_args = _prefill(model, ids_BS, mask_BL, positions_BS, cache)
    positions_BL = positions_BS
    if copies is not None:
        index = torch.tensor(copies, device=device)
        cache.batch_select_indices(index)
        logits_BV, mask_BL, positions_BL = logits_BV[index], mask_BL[index], positions_BL[index]
    knobs = row_tensors([r.sampling for r in rows], [r.seed for r in rows], device)
    filtered = any(r.sampling.filtered for r in rows)
    live = list(range(len(rows)))  # batch position -> row index
    passes = 1
    while True:
        next_B = _advance([rows[i] for i in live], logits_BV, knobs, filtered, vocab_limit)
        if on_step is not None:
            on_step(len(live))
        keep = [j for j, i in enumerate(live) if not rows[i].done]
        if not keep or len(keep) <= len(live) // 2:
            _store(store, cache, mask_BL, [(j, rows[i]) for j, i in enumerate(live) if rows[i].done])
        if not keep:
            return passes
        if len(keep) <= len(live) // 2:
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask_BL, positions_BL, next_B = mask_BL[index], positions_BL[index], next_B[index]
            knobs = tuple(t[index] for t in knobs)
            live = [live[j] for j in keep]
        mask_BL = torch.cat([mask_BL, mask_BL.new_ones(len(live), 1)], dim=-1)
        positions_BL = positions_BL[:, -1:] + 1
        logits_BV = _forward(model, next_B[:, None], mask_BL, positions_BL, cache_args)
        passes += 1


def _distinct(rows: list[Row], reused: list) -> tuple[list[int], list[int] | None]:
    """Rows to prefill (one per prompt among rows without a stored prefix) and, when some
    were shared, each row's position among them (None: every row is prefilled)."""
    first: dict[object, int] = {}
    unique, copies = [], []
    for b, (row, (n, _)) in enumerate(zip(rows, reused, strict=True)):
        key = tuple(row.prompt) if n == 0 else b
        if key not in first:
            first[key] = len(unique)
            unique.append(b)
        copies.append(first[key])
    return unique, (copies if len(unique) < len(rows) else None)


def _store(store: PrefixStore | None, cache: DynamicCache, mask_BL: torch.Tensor,
           done: list[tuple[int, Row]]) -> None:
    """Leave finished rows' sequences in ``store``: prompt and every sampled token but the
    last (the last was never fed through the model)."""
    if store is not None and done:
        store_rows(store, cache, mask_BL, [(j, row.prompt + row.tokens[:-1]) for j, row in done])


def _prefill(
    model: torch.nn.Module, ids_BS: torch.Tensor, mask_BL: torch.Tensor, positions_BS: torch.Tensor,
    cache: DynamicCache,
) -> tuple[torch.Tensor, dict[str, DynamicCache]]:
    """Run the prompts through ``cache`` (which may hold reused columns); returns last logits
    and the cache kwargs.

    The prompts go in chunks of ``PREFILL_TOKENS`` tokens over the batch (``chunk`` columns of
    every row), so attention's score tensor is ``B × heads × chunk × L`` rather than
    ``B × heads × L × L``: on CPU, where a masked ``scaled_dot_product_attention`` runs the math
    kernel, eight 1,500-token prompts of SmolLM2 otherwise take 1.3 GB per layer call. Each
    chunk attends to the cache of the chunks before it, so the result is the one-pass prefill.
    """
    cache_args = {cache_kwarg(model): cache}
    cached, length = cache.get_seq_length(), ids_BS.shape[1]
    chunk = max(PREFILL_MIN_CHUNK, PREFILL_TOKENS // max(1, ids_BS.shape[0]))
    for start in range(0, length, chunk):
        end = min(length, start + chunk)
        logits_BV = _forward(model, ids_BS[:, start:end], mask_BL[:, :cached + end],
                             positions_BS[:, start:end], cache_args)
    if cache.get_seq_length() != cached + length:
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


def _advance(
    batch: list[Row], logits_BV: torch.Tensor, knobs: tuple[torch.Tensor, ...], filtered: bool,
    vocab_limit: int = 0,
) -> torch.Tensor:
    """Pick and record one token for every live row; returns the picked tokens ``[B]``.

    ``knobs`` are the rows' ``(temperature, top_k, top_p, seed)`` tensors; a row's position
    is the count of tokens it generated, so its draw is the slot sampler's draw at that token.
    Finished rows riding along are picked for (harmlessly) but not recorded.
    """
    positions_B = torch.tensor([len(r.tokens) for r in batch], device=logits_BV.device)
    tokens_B, logprobs_B = select(logits_BV, *knobs, positions_B, filtered, vocab_limit)
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
