"""The engine contracts: what the loop and the rollout may call on an engine, and what it declares.

An engine (``engine.name``: ``local``, ``trio``) is a **service** that hands out a **training
client** and **sampling clients** with PyTRIO's surface. The loop and the rollout talk to these
Protocols only, and where engines differ they read the client's ``capabilities`` record — never
``hasattr``/``getattr`` on an engine object. A new engine (or a new sampler of the local one,
such as vLLM) implements the Protocols and fills in its capabilities.

Futures: training calls return a future with ``.result()`` (PyTRIO's ``APIFuture``; the local
engine's are already resolved); sampling is ``async``. Shapes: ``_D`` datums.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class EngineCapabilities:
    """What a training client (and the engine behind it) can do beyond the common surface."""

    #: calls run in the caller's thread and block it (the local engine): the loop moves them to a
    #: worker thread where a rollout should keep going meanwhile (``trainer.max_staleness=1``)
    in_process: bool = False
    #: ``compute_reference_logprobs(datums_D)`` gives the KL reference's target log-probs in
    #: process; without it the loop asks the base model's sampling client (``compute_logprobs``)
    reference_logprobs: bool = False
    #: ``freeze_reference()`` makes the reference the current weights (after a warm start)
    freeze_reference: bool = False
    #: ``save_state``/``load_state*`` are collectives every rank calls (FSDP2 shards), and a rank
    #: without datums in a mini-batch runs ``forward_backward_idle()`` to match the others' passes
    sharded_state: bool = False
    #: queued calls overlap: the next ``forward_backward``/``optim_step`` may be submitted before
    #: the last one's result is awaited (the remote engine's pipelining)
    pipelined: bool = False


@dataclass(frozen=True)
class LoopLimits:
    """The loop's numbers an engine sizes itself by, passed as values (an engine never reads the
    ``trainer`` config): the micro-batch limits its training calls are cut by, and whether a
    rollout samples while an update runs."""

    max_datums_per_microbatch: int = 32  # trainer.max_datums_per_microbatch
    max_padded_tokens_per_microbatch: int = 64_000  # trainer.max_padded_tokens_per_microbatch
    overlapped_rollout: bool = False  # trainer.max_staleness > 0
    # trajectories a training rollout samples at once (trainer.questions_per_step × rollout.group_size,
    # loop/plan.py); 0 = unknown. engine.kv_slots=null sizes the local pool to at most this
    rollout_trajectories: int = 0


class DataParallelGroup(Protocol):
    """What an engine reads of the job's data parallelism. The entry point hands it in
    (``searchr1.distributed.context.DataParallel`` implements it); an engine never imports the
    job layer, and ``None`` means one process."""

    rank: int
    world: int
    local_rank: int  # this rank's GPU on its node
    bucket_mb: float  # gradient all-reduce bucket size (MiB of fp32)

    @property
    def active(self) -> bool:
        """More than one process."""

    @property
    def is_rank0(self) -> bool:
        """This process is rank 0 (it writes the shared files)."""

    def guard(self, what: str) -> AbstractContextManager:
        """A block of collectives named ``what``: a lost peer there stops the job with a message."""

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""

    def barrier(self) -> None:
        """Every rank waits for the others."""


@runtime_checkable
class SamplingClient(Protocol):
    """Token ids in, sampled token ids and their log-probs out (``pytrio.SamplingClient``)."""

    async def sample_async(self, prompt: Any, num_samples: int = 1, sampling_params: Any = None,
                           include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
                           return_text: bool = True) -> Any:
        """``num_samples`` continuations of ``prompt`` (a ``ModelInput``): a ``SampleResponse``."""

    async def compute_logprobs_async(self, prompt: Any) -> list[float | None]:
        """Log-prob of each prompt token under the sampled weights; the first is None."""

    def get_tokenizer(self) -> Any:
        """The tokenizer of the sampled model."""


@runtime_checkable
class TrainingClient(Protocol):
    """The trained policy (``pytrio.TrainingClient``), with its ``capabilities``."""

    capabilities: EngineCapabilities

    def forward(self, data: list[Any], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> Any:
        """Loss and per-datum target log-probs without gradients (a future)."""

    def forward_backward(self, data: list[Any], loss_fn: str = "cross_entropy",
                         loss_fn_config: dict | None = None) -> Any:
        """Forward and backward; gradients accumulate until ``optim_step`` (a future)."""

    def forward_backward_custom(self, data: list[Any], loss_fn: Any,
                                loss_fn_config: dict | None = None) -> Any:
        """``loss_fn(data, logprobs_D)`` → (loss, metrics), backpropagated exactly (a future)."""

    def optim_step(self, adam_params: Any) -> Any:
        """One optimizer step on the accumulated gradients (a future)."""

    def save_state(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False) -> Any:
        """Weights, optimizer and step under ``name`` (a future with ``.path``)."""

    def load_state(self, path: str) -> Any:
        """The weights of ``path``; the optimizer starts fresh (a future)."""

    def load_state_with_optimizer(self, path: str) -> Any:
        """Weights, optimizer and step of ``path``: training resumes exactly (a future)."""

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None) -> Any:
        """What a sampler loads, under ``name`` (a future with ``.path``)."""

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> SamplingClient:
        """A sampling client of the weights as they are now (a rollout phase starts)."""

    def get_tokenizer(self) -> Any:
        """The tokenizer of the trained model."""


@runtime_checkable
class ServiceClient(Protocol):
    """An engine (``pytrio.ServiceClient``): the tokenizer and the clients of one model."""

    def get_tokenizer(self) -> Any:
        """The tokenizer of the served model."""

    def create_sampling_client(self, model_path: str | None = None) -> SamplingClient:
        """The base model's sampler (``None``: eval of the untrained model), or saved weights'."""

    def create_lora_training_client(self, rank: int, seed: int, base_model: str | None = None) -> TrainingClient:
        """The training client of ``model.tuning`` (LoRA of ``rank``, or every weight)."""

    def create_training_client_from_state_with_optimizer(self, path: str) -> TrainingClient:
        """A training client resumed from a saved state."""


@runtime_checkable
class CountsTokens(Protocol):
    """Optional for a sampling client: the tokens it has picked so far, counted while a turn is
    still decoding (the local engine's samplers do). Progress bars read it between responses; a
    client without it shows the tokens of finished turns only."""

    def tokens_picked(self) -> int:
        """Tokens sampled by this client's engine since it started (a running count)."""
