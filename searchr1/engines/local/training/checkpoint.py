"""Atomic checkpoints of the local trainer: weights (LoRA adapters or all), optimizer, step, RNG.

A checkpoint is a directory. Under LoRA ``save_pretrained`` writes the adapters
(``adapter_model.safetensors`` + ``adapter_config.json``), so any peft tool can load it;
a LoRA training state adds the frozen KL reference adapter when there is one
(``reference_adapter/``, ``reference.py``); under full fine-tuning ``full_weights.safetensors`` holds every trained weight in its
training precision (fp32 masters), and a sampler save is a plain HF folder (config +
safetensors in the sampling dtype + tokenizer). A full training state adds ``trainer_state.pt`` (AdamW state, step count, torch RNG
states). Everything is written into a temporary sibling directory (``.<name>.*``), synced
to disk and renamed into place only when complete, so a crash (or a node losing power)
never leaves a half-written checkpoint. A crash can leave the temp directory behind: the
loop's ``clean_orphans`` (``searchr1/loop/checkpoint.py``) removes it on resume. The test
hook ``engine_mid_write`` (``SEARCHR1_KILL_AT``, see ``crash_point``) kills the process with
the files in the temp directory and nothing renamed yet.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from peft import PeftModel
from peft.utils import load_peft_weights, set_peft_model_state_dict
from safetensors.torch import load_file
from safetensors.torch import load_model as load_safetensors_model
from safetensors.torch import save_model as save_safetensors_model

from searchr1.engines.local.training import reference as lora_reference
from searchr1.utils.faults import crash_point

TRAINER_STATE_FILE = "trainer_state.pt"
FULL_WEIGHTS_FILE = "full_weights.safetensors"
_STEP_NAME = re.compile(r"step_(\d+)$")  # the loop names its saves step_<N> (loop/checkpoint.py)


def step_of(name: str) -> int | None:
    """The step a save named ``step_<N>`` belongs to (for the crash hook), else None."""
    m = _STEP_NAME.search(name)
    return int(m.group(1)) if m else None


def write_atomically(final_dir: Path, overwrite: bool, write: Callable[[Path], None]) -> int:
    """Run ``write(tmp_dir)`` and rename the result to ``final_dir``; return its size in bytes."""
    final_dir = Path(final_dir)
    if final_dir.exists() and not overwrite:
        raise FileExistsError(f"checkpoint {final_dir} exists; pass overwrite=True to replace it")
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.", dir=final_dir.parent))
    try:
        write(tmp_dir)
        crash_point("engine_mid_write", step_of(final_dir.name))  # test hook: SIGKILL here
        _fsync_tree(tmp_dir)
        if final_dir.exists():  # overwrite: move the old one aside, then swap in the new one
            trash = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.old.", dir=final_dir.parent))
            os.replace(final_dir, trash / "old")
            os.replace(tmp_dir, final_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp_dir, final_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return sum(p.stat().st_size for p in final_dir.rglob("*") if p.is_file())


def _fsync_tree(root: Path) -> None:
    """Flush the files under ``root`` to disk, so the rename never publishes empty files."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def save_adapters(model: PeftModel, directory: Path) -> None:
    """Write the trained LoRA adapter's weights and config in peft's own format."""
    model.save_pretrained(str(directory), selected_adapters=[lora_reference.POLICY])


def load_adapters(model: PeftModel, directory: Path) -> None:
    """Load adapter weights saved by ``save_adapters`` into ``model`` (strict on LoRA keys)."""
    weights = load_peft_weights(str(directory), device=str(_device_of(model)))
    result = set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing:
        raise ValueError(f"checkpoint {directory} lacks adapter weights, e.g. {missing[:3]}")


def save_weights(model: torch.nn.Module, directory: Path, tuning: str) -> None:
    """The trained weights: peft adapters under ``lora``, every weight under ``full``."""
    if tuning == "lora":
        save_adapters(model, directory)  # type: ignore[arg-type]
        lora_reference.save(model, directory)  # the frozen KL reference, when a warm start made one
    else:
        save_safetensors_model(model, str(directory / FULL_WEIGHTS_FILE))  # tied weights once


def load_weights(model: torch.nn.Module, directory: Path, tuning: str) -> None:
    """Inverse of ``save_weights`` (strict: a checkpoint of the other tuning is refused)."""
    if tuning == "lora":
        load_adapters(model, directory)  # type: ignore[arg-type]
        lora_reference.load(model, directory)
        return
    path = Path(directory) / FULL_WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no full weights ({FULL_WEIGHTS_FILE}); "
                                "was it saved with model.tuning=lora?")
    load_safetensors_model(model, str(path), strict=True, device=str(_device_of(model)))


def save_sampler_weights(model: torch.nn.Module, tokenizer, directory: Path, tuning: str) -> None:
    """What a sampler loads: the adapters (lora) or an HF folder in the sampling dtype (full)."""
    if tuning == "lora":
        save_adapters(model, directory)  # type: ignore[arg-type]
        return
    dtype = getattr(model, "searchr1_sample_dtype", next(model.parameters()).dtype)
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    model.save_pretrained(str(directory), state_dict=state)  # type: ignore[attr-defined]
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(directory))


def load_hf_weights(model: torch.nn.Module, directory: Path) -> None:
    """Load a sampler save of ``save_sampler_weights`` (full) into ``model``, cast to its dtype."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} holds no safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f), device=str(_device_of(model))))
    result = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise ValueError(f"{directory} does not fit the model: missing {result.missing_keys[:3]}, "
                         f"unexpected {result.unexpected_keys[:3]}")


def rng_state() -> dict[str, object]:
    """Torch's CPU (and, when present, CUDA) RNG states."""
    state: dict[str, object] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, object]) -> None:
    """Inverse of ``rng_state``."""
    torch.set_rng_state(state["cpu"])  # type: ignore[arg-type]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])  # type: ignore[arg-type]


def save_trainer_state(directory: Path, optimizer_state: dict, step: int) -> None:
    """Write optimizer state, step count and RNG states next to the adapters."""
    payload = {"optimizer": optimizer_state, "step": step, "rng": rng_state()}
    torch.save(payload, directory / TRAINER_STATE_FILE)


def load_trainer_state(directory: Path) -> dict:
    """Read what ``save_trainer_state`` wrote (tensors and plain values only)."""
    path = Path(directory) / TRAINER_STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{directory} holds adapter weights but no optimizer state")
    return torch.load(path, map_location="cpu", weights_only=True)


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
