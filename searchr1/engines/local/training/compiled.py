"""Compiled decoder layers for the training passes (``engine.compile_layers``).

Inside ``compiled_layers`` every decoder layer's forward runs through ``torch.compile``
(inductor, dynamic shapes), so the elementwise work between the matmuls (RMSNorm, RoPE,
SiLU × up, residual adds, the adapters' scaling and sum) fuses into a few kernels instead of
one kernel per op. Only the layers are compiled, one wrapper per layer kept for the life of
the model: the layers run the same code, so dynamo compiles it once and re-uses it with each
layer's weights as inputs (PyTorch's "regional compilation"). As ``recompute.py`` does, the
wrappers are set for the block only, so the sampler (which shares the model) runs eager.
Values equal the eager forward's up to float rounding (tested).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch

from searchr1.engines.local.training.recompute import decoder_layers, wrapped_forwards

_WRAPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer → its compiled forward


def _compiled(layer: torch.nn.Module):
    wrapper = _WRAPPERS.get(layer)
    if wrapper is None:
        wrapper = torch.compile(type(layer).forward.__get__(layer), dynamic=True)
        _WRAPPERS[layer] = wrapper
    return wrapper


@contextlib.contextmanager
def compiled_layers(model: torch.nn.Module, enabled: bool = True) -> Iterator[int]:
    """Run ``model``'s decoder layers compiled inside the block; yields how many.

    Callers hold the model lock, so no other forward sees the wrappers. Enter it before
    ``recompute_layers``, which then checkpoints the compiled forwards.
    """
    layers = decoder_layers(model) if enabled else []
    with wrapped_forwards(layers, _compiled):
        yield len(layers)
