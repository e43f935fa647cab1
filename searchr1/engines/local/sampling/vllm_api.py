"""The boundary to vLLM: the only module that imports it (``engine.sampler=vllm``).

``VllmApi`` is the handful of vLLM calls the sampler makes — open an in-process engine, make a
request's sampling params and prompt, read a finished output, load weights into the engine's
model — so the rest of the sampler (``vllm_engine.py``, ``vllm_client.py``) is plain Python
tested on CPU against a fake with the same methods (``tests/helpers/fake_vllm.py``).

The engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: vLLM's engine core
and its one worker live in the caller's process, as verl's hybrid engine colocates them), so
weights reach it as the trainer's own CUDA tensors, with no copy through another process.
vLLM is an optional dependency: without it, ``VllmApi()`` raises ``VllmMissing`` with the line
that installs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

INSTALL = ('pip install "vllm==0.22.1" (a CUDA machine; it pins torch 2.11.0) — with uv: '
           '`uv pip install "vllm==0.22.1"`, then run with `uv run --no-sync` so uv keeps it')


class VllmMissing(ImportError):
    """``engine.sampler=vllm`` on a machine without vLLM."""


@dataclass(frozen=True)
class Completion:
    """One finished sequence as vLLM returned it."""

    request_id: str
    tokens: list[int]
    logprobs: list[float]  # of each sampled token (the engine's logprobs_mode: raw_logprobs)
    finish_reason: str  # "stop" | "length" | "abort"
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


class VllmApi:
    """vLLM's API as the sampler uses it (see the module docstring)."""

    def __init__(self) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in process (the weights are ours)
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        try:
            import vllm  # noqa: F401  (lazy on purpose: an optional, heavy dependency)
            from vllm import SamplingParams
            from vllm.engine.arg_utils import EngineArgs
            from vllm.logprobs import FlatLogprobs
            from vllm.v1.engine.llm_engine import LLMEngine
        except ImportError as error:
            raise VllmMissing(f"engine.sampler=vllm needs vLLM, which is not installed ({error}). "
                              f"Install it: {INSTALL}.") from error
        self.version = vllm.__version__
        self._params, self._args, self._engine, self._flat = SamplingParams, EngineArgs, LLMEngine, FlatLogprobs

    def open_engine(self, args: dict[str, Any]):
        """An in-process ``LLMEngine`` from engine arguments (``vllm_setup.engine_args``)."""
        return self._engine.from_engine_args(self._args(**args), enable_multiprocessing=False)

    def sampling_params(self, *, temperature: float, top_p: float, top_k: int, seed: int | None,
                        max_tokens: int, stop: list[str], stop_token_ids: list[int], detokenize: bool):
        """One sequence's params: the sampled token's log-prob only, EOS as a listed stop id."""
        return self._params(n=1, temperature=temperature, top_p=top_p, top_k=max(top_k, 0), seed=seed,
                            max_tokens=max_tokens, stop=stop or None, stop_token_ids=stop_token_ids,
                            ignore_eos=True, include_stop_str_in_output=True, skip_special_tokens=False,
                            detokenize=detokenize, logprobs=0, flat_logprobs=True)

    @staticmethod
    def prompt(tokens: list[int]) -> dict[str, list[int]]:
        """A prompt of token ids (vLLM's ``TokensPrompt``)."""
        return {"prompt_token_ids": tokens}

    def completion(self, output) -> Completion:
        """A finished ``RequestOutput`` of one sequence."""
        seq = output.outputs[0]
        tokens = list(seq.token_ids)
        lps = seq.logprobs
        if isinstance(lps, self._flat):  # one entry per position: the sampled token's
            values = [lps.logprobs[i] for i in lps.start_indices]
        else:
            values = [position[token].logprob for position, token in zip(lps, tokens)]
        return Completion(output.request_id, tokens, values, seq.finish_reason or "abort",
                          int(output.num_cached_tokens or 0))

    @staticmethod
    def load_weights(engine, weights: Iterable[tuple[str, Any]]) -> None:
        """Copy HF-named tensors into the engine's model in place (its own loaders fuse q/k/v)."""
        engine.apply_model(lambda model: model.load_weights(weights))
