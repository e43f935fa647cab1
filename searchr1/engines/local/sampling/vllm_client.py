"""``VllmSamplingClient``: PyTRIO's sampling surface served by vLLM (``engine.sampler=vllm``).

Token ids in, token ids and the sampled tokens' log-probs out, as the slot sampler answers:

- the same request rules (``requests.py``): validation, the seed of sequence ``i`` of a request,
  the stop rule and the length cap ``engine.max_seq_len + 1 − prompt``;
- each sequence is its own vLLM request with its own seed (``engine.vllm.seeded``; vLLM then
  draws seeded rows one by one), so a trajectory's draws do not depend on what it is batched
  with; the group's shared prompt and a trajectory's earlier turns come from vLLM's prefix cache;
- stops: vLLM ends a sequence on the rule's stop ids (EOS among them; vLLM's own EOS handling is
  off so both samplers stop on the same ids) and stop strings, then the rule itself cuts the
  returned tokens, so the cut is the slot sampler's on the same tokens;
- log-probs are the raw model's (vLLM's ``logprobs_mode=raw_logprobs``: temperature 1, before
  top-p/top-k), the trainer's definition, as the slot sampler returns them;
- ``compute_logprobs`` and prompt log-probs run the HF model (``LocalSamplingClient``).

The weights are the trainer's own: each request carries its ``WeightsSource`` and the engine
pushes new weights in place when they change (``vllm_engine.py``).
"""

from __future__ import annotations

import random
from concurrent.futures import Future

from pytrio.types.forward.model_input import ModelInput
from pytrio.types.future.api_future import APIFuture
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence
from pytrio.types.sample.sampling_params import SamplingParams

from searchr1.engines.local.sampling.requests import RowSpec, eos_ids_of, prompt_tokens, row_specs, too_long
from searchr1.engines.local.sampling.slot_types import WeightsSource
from searchr1.engines.local.sampling.stops import LENGTH, STOP
from searchr1.engines.local.sampling.vllm_api import Completion
from searchr1.engines.local.sampling.vllm_engine import VllmEngine

_DEFAULT_PARAMS = SamplingParams()


class VllmSamplingClient:
    """In-process vLLM behind ``pytrio.SamplingClient``'s calls (see the module docstring)."""

    def __init__(self, engine: VllmEngine, source: WeightsSource, tokenizer, max_seq_len: int,
                 scorer, detokenize: bool, seeded: bool = True, seed: int = 0) -> None:
        self.engine, self.source, self.tokenizer = engine, source, tokenizer
        self.max_len = max_seq_len
        self.scorer = scorer  # a LocalSamplingClient on the HF decode: prompt log-probs
        self.seeded = seeded
        self.stats = engine.stats
        self._eos_ids = eos_ids_of(source.model, tokenizer)
        self._detokenize = detokenize  # vLLM has the tokenizer: it matches stop strings itself
        self._rng = random.Random(seed)  # seeds for requests without one

    def get_tokenizer(self):
        return self.tokenizer

    async def sample_async(self, prompt: ModelInput, num_samples: int = 1,
                           sampling_params: SamplingParams = _DEFAULT_PARAMS,
                           include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
                           return_text: bool = True) -> SampleResponse:
        """``num_samples`` continuations of ``prompt`` (see the module docstring)."""
        return await self.sample(prompt, num_samples, sampling_params, include_prompt_logprobs,
                                 topk_prompt_logprobs, return_text)

    def sample(self, prompt: ModelInput, num_samples: int = 1, sampling_params: SamplingParams = _DEFAULT_PARAMS,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
               return_text: bool = True) -> APIFuture[SampleResponse]:
        """Queue a sampling request; the future's ``.result()`` (or ``await``) gives the response."""
        if include_prompt_logprobs or topk_prompt_logprobs > 0:  # prompt scoring: the HF model
            return self.scorer.sample(prompt, num_samples, sampling_params, include_prompt_logprobs,
                                      topk_prompt_logprobs, return_text)
        tokens = prompt_tokens(prompt)
        specs = row_specs(sampling_params, num_samples, self._eos_ids, self._decode_raw,
                          lambda: self._rng.getrandbits(63))
        cap = self.max_len + 1 - len(tokens)
        if cap < 1:
            raise too_long(len(tokens), self.max_len)
        specs = [RowSpec(r.sampling, r.stop.capped(min(r.stop.max_tokens, cap)), r.seed) for r in specs]
        params = [self._params(r) for r in specs]
        done: Future = Future()

        def respond(inner: Future) -> None:
            if done.cancelled():
                return
            if inner.exception() is not None:
                done.set_exception(inner.exception())
                return
            sequences = [self._sequence(c, r, return_text) for c, r in zip(inner.result(), specs)]
            done.set_result(SampleResponse(sequences=sequences, input_tokens=len(tokens),
                                           output_tokens=sum(len(s.tokens) for s in sequences)))

        self.engine.submit(tokens, params, self.source).add_done_callback(respond)
        return APIFuture(done)

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        return await self.scorer.compute_logprobs(prompt)

    def compute_logprobs(self, prompt: ModelInput):
        """Log-prob of each prompt token under the model (the HF forward); the first is None."""
        return self.scorer.compute_logprobs(prompt)

    def tokens_picked(self) -> int:
        """Tokens sampled so far by the engine (``engines.base.CountsTokens``)."""
        return self.stats.sampled_tokens

    def _params(self, row: RowSpec):
        """vLLM's params of one sequence: the rule's stop ids and strings, its cap, its seed."""
        s = row.sampling
        return self.engine.api.sampling_params(
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
            seed=row.seed if self.seeded else None, max_tokens=row.stop.max_tokens,
            stop=list(row.stop.strings) if self._detokenize else [],
            stop_token_ids=sorted(row.stop.token_ids), detokenize=self._detokenize and bool(row.stop.strings))

    def _sequence(self, done: Completion, row: RowSpec, return_text: bool) -> SampleSequence:
        """The rule's cut of a finished sequence (vLLM stopped at or after the rule's end)."""
        tokens, logprobs = done.tokens, done.logprobs
        if not tokens:
            ending = None
        elif self._detokenize or not row.stop.strings:
            ending = row.stop.check_finished(tokens)
        else:  # vLLM could not match the strings without a tokenizer: look through every token
            ending = row.stop.check(tokens, len(tokens))
        if ending is not None:
            tokens, logprobs, reason = tokens[: ending.length], logprobs[: ending.length], ending.reason
        else:
            reason = LENGTH if done.finish_reason == "length" else STOP
        text = self.tokenizer.decode(tokens, skip_special_tokens=True) if return_text else None
        return SampleSequence(stop_reason=reason, tokens=list(tokens), text=text, logprobs=list(logprobs))

    def _decode_raw(self, tokens: list[int]) -> str:
        """Decode with special tokens kept, so stop strings can match them too."""
        return self.tokenizer.decode(tokens, skip_special_tokens=False)
