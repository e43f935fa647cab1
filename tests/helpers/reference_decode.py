"""The simplest correct seeded decode, for checking both samplers token for token.

One sequence at a time, the whole sequence through the HF model for every token (no cache, no
padding, no batching), the token picked by ``select`` at its position with the sequence's seed,
and the sequence ended by the shared ``StopRule`` after each token.
"""

from __future__ import annotations

import torch
from pytrio import SamplingParams

from searchr1.engines.local.sampling.requests import eos_ids_of as _eos_ids, row_seed as _row_seed
from searchr1.engines.local.sampling.select import RowSampling, row_tensors, select
from searchr1.engines.local.sampling.stops import StopRule


def stop_rule(model, tokenizer, params: SamplingParams) -> StopRule:
    """The rule the client builds for ``params`` (EOS ids, stop strings or ids, max_tokens)."""
    items = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
    eos = _eos_ids(model, tokenizer)
    if items and all(isinstance(s, int) for s in items):
        return StopRule(eos | frozenset(items), max_tokens=params.max_tokens)
    return StopRule(eos, tuple(items), lambda t: tokenizer.decode(t, skip_special_tokens=False),
                    params.max_tokens)


@torch.no_grad()
def reference_decode(model, tokenizer, prompt: list[int], n: int, params: SamplingParams):
    """``[(tokens, logprobs)]`` of the ``n`` sequences of a request seeded with ``params.seed``."""
    rule = stop_rule(model, tokenizer, params)
    sampling = RowSampling(params.temperature, params.top_k, params.top_p)
    out = []
    for i in range(n):
        knobs = row_tensors([sampling], [_row_seed(params.seed or 0, i)], "cpu")
        tokens: list[int] = []
        logprobs: list[float] = []
        while True:
            logits = model(torch.tensor([prompt + tokens])).logits[:, -1]
            tok, lp = select(logits, *knobs, torch.tensor([len(tokens)]), sampling.filtered)
            tokens.append(int(tok))
            logprobs.append(float(lp))
            if rule.check(tokens) is not None:
                break
        out.append((tokens, logprobs))
    return out
