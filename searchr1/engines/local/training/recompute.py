"""Activation recomputation of the decoder layers for one training forward, in any mode.

Without it autograd keeps every intermediate of every decoder layer until backward: about
1.2 MB per token for SmolLM2-135M in float32 (30 layers), so one SFT micro-batch of 16
trajectories × 1.5k tokens holds ~30 GB. Inside ``recompute_layers`` each decoder layer
keeps only its input; its intermediates are recomputed one layer at a time during backward
(non-reentrant ``torch.utils.checkpoint``), so the graph costs hidden_size floats per token
and layer plus one layer's intermediates. The recomputation replays the same kernels on the
same inputs, so values and gradients do not change.

transformers' own switch (``gradient_checkpointing_enable``) acts only in training mode,
and the local trainer keeps its model in eval mode (no dropout), so the layers' ``forward``
is wrapped here instead, for the duration of the block only: the sampler, which shares the
model and its lock, never sees the wrapper.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from searchr1.engines.local.training.logprobs import causal_lm

_MISSING = object()


def recomputes(setting: bool | None, device: torch.device) -> bool:
    """``engine.activation_checkpointing``: null is on for CPU, off on GPUs."""
    return device.type == "cpu" if setting is None else bool(setting)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost transformers decoder layers inside ``model`` (peft wrappers included)."""
    found: list[torch.nn.Module] = []
    inner: set[int] = set()
    for module in model.modules():
        if id(module) in inner or not isinstance(module, GradientCheckpointingLayer):
            continue
        found.append(module)
        inner.update(id(m) for m in module.modules())
    return found


_CACHE_KWARGS = ("past_key_values", "cache", "layer_past")  # transformers' names across versions


def _checkpointed(forward: Callable, config: object, context: Callable, *args: object, **kwargs: object) -> object:
    """``forward`` under non-reentrant checkpointing: only its inputs are kept for backward.

    The replay runs in backward, after the caller's block has ended, so it re-selects the
    attention implementation the forward ran with (the packed trainer switches it for its
    forward only) and re-enters ``context()``, the caller's block around the forward (the
    trainer's autocast and peft's input-cast switch), so the replay runs the code the forward
    ran. Without it the replay sees the switch back on: eager layers give the same values (the
    cast is undone by autocast), but with ``engine.compile_layers`` an H100 run (3B LoRA) stopped
    on "recomputed values ... have different metadata", one more 0-d tensor in the replay, as from
    a second compiled graph (with this fix the same run's first update goes through: H100,
    2026-12-07, commit b468f2e). A KV cache is
    dropped, as transformers does: the replay would write it a second time.
    """
    for name in _CACHE_KWARGS:
        if kwargs.get(name) is not None:
            kwargs[name] = None
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    attention = getattr(config, "_attn_implementation_internal", None)

    def replay(*a: object, **k: object) -> object:
        with _attention_implementation(config, attention), context():
            return forward(*a, **k)

    return checkpoint(replay, *args, use_reentrant=False, **kwargs)


@contextlib.contextmanager
def _attention_implementation(config: object, name: str | None) -> Iterator[None]:
    """``config``'s attention implementation set to ``name`` inside the block, restored after."""
    if config is None:
        yield
        return
    previous = config._attn_implementation_internal  # type: ignore[attr-defined]
    config._attn_implementation_internal = name  # type: ignore[attr-defined]
    try:
        yield
    finally:
        config._attn_implementation_internal = previous  # type: ignore[attr-defined]


@contextlib.contextmanager
def recompute_layers(model: torch.nn.Module, enabled: bool = True,
                     context: Callable = contextlib.nullcontext) -> Iterator[int]:
    """Checkpoint every decoder layer of ``model`` inside the block; yields how many.

    A no-op (yields 0) when ``enabled`` is false or grad is off: without a backward there is
    nothing to keep. Callers hold the model lock, so no other forward sees the wrappers; the
    backward that replays the layers must run under it too (the trainer's calls do).
    ``context`` makes the context manager the caller runs the forward in; each replay runs
    inside a new one.
    """
    layers = decoder_layers(model) if enabled and torch.is_grad_enabled() else []
    config = getattr(causal_lm(model), "config", None)
    with wrapped_forwards(layers, lambda layer: functools.partial(_checkpointed, layer.forward, config, context)):
        yield len(layers)


@contextlib.contextmanager
def wrapped_forwards(layers: list[torch.nn.Module], wrap: Callable) -> Iterator[None]:
    """Each layer's ``forward`` set to ``wrap(layer)`` inside the block, its own restored after."""
    saved = [layer.__dict__.get("forward", _MISSING) for layer in layers]
    for layer in layers:
        layer.forward = wrap(layer)
    try:
        yield
    finally:
        for layer, previous in zip(layers, saved):
            if previous is _MISSING:
                del layer.forward
            else:
                layer.forward = previous
