"""The KL reference of a LoRA run that starts from a warm start: a frozen copy of the adapters.

The reference policy is the policy RL starts from. Without a warm start that is the base
model, and "adapters off" computes it for free (fresh adapters have B = 0). After a warm
start the initial policy is base + warm-start adapters, and adapters off would be the model
*before* the warm start, ~1.5 nats/token away. ``freeze`` copies the live adapters into a
second peft adapter, ``reference``, which no optimizer holds; ``active`` routes a forward
through it. The copy is saved beside every training checkpoint (``DIRNAME``) and restored
on resume, so a resumed run keeps the same reference.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

NAME = "reference"  # the peft adapter name of the frozen copy
POLICY = "default"  # the trained adapter (peft's default name)
DIRNAME = "reference_adapter"  # inside a training checkpoint
WEIGHTS = "adapter_model.safetensors"


def has(model) -> bool:
    """Whether ``model`` (a peft model) holds a frozen reference adapter."""
    return NAME in getattr(model, "peft_config", {})


@torch.no_grad()
def freeze(model) -> None:
    """Make the reference adapter an exact copy of the trained adapter as it is now."""
    load_state(model, get_peft_model_state_dict(model, adapter_name=POLICY))


@torch.no_grad()
def load_state(model, state: dict[str, torch.Tensor]) -> None:
    """Set the reference adapter's weights (peft's adapter-free key names), creating it if absent."""
    if not has(model):
        device = next(model.parameters()).device
        forked = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=forked):  # the new adapter's init draws numbers
            model.add_adapter(NAME, model.peft_config[POLICY])
    result = set_peft_model_state_dict(model, state, adapter_name=NAME)
    missing = [k for k in result.missing_keys if f"lora_A.{NAME}" in k or f"lora_B.{NAME}" in k]
    if missing:
        raise ValueError(f"reference adapter state lacks weights, e.g. {missing[:3]}")
    for name, param in model.named_parameters():
        if f".{NAME}." in name:
            param.requires_grad_(False)


@contextlib.contextmanager
def active(model):
    """Forwards inside run through the reference adapter instead of the trained one.

    The layers' active-adapter field is swapped directly: peft's ``set_adapter`` would also
    flip ``requires_grad`` on the trained adapter, which the optimizer holds.
    """
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    saved = [m._active_adapter for m in layers]
    try:
        for m in layers:
            m._active_adapter = [NAME]
        yield model
    finally:
        for m, value in zip(layers, saved):
            m._active_adapter = value


def save(model, checkpoint: Path) -> None:
    """Write the reference adapter into ``checkpoint/DIRNAME`` (nothing when there is none)."""
    if not has(model):
        return
    state = get_peft_model_state_dict(model, adapter_name=NAME)
    (Path(checkpoint) / DIRNAME).mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()},
              str(Path(checkpoint) / DIRNAME / WEIGHTS), metadata={"format": "pt"})


def load(model, checkpoint: Path) -> bool:
    """Restore a reference adapter saved by ``save``; False when the checkpoint has none."""
    path = Path(checkpoint) / DIRNAME / WEIGHTS
    if not path.is_file():
        return False
    device = next(model.parameters()).device
    load_state(model, load_file(str(path), device=str(device)))
    return True
