"""``model.lora_compute``: where the adapters' matmuls run, and that the gradients agree."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from searchr1.engines.local.training.setup import build_trainable


def _lora(tiny_model_dir, dtype, compute):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    return build_trainable(base, "lora", rank=4, alpha=8, seed=0, lora_compute=compute)


def _adapter_inputs(trainable) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
             for name, m in trainable.model.named_modules() if name.endswith("lora_A.default")]
    ids = torch.arange(3, 15).view(1, -1)
    with trainable.autocast():
        trainable.model(input_ids=ids).logits.float().sum().backward()
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("compute, expected", [("base", torch.bfloat16), ("float32", torch.float32)])
def test_bf16_base_adapters_run_in_the_chosen_dtype(tiny_model_dir, compute, expected):
    trainable = _lora(tiny_model_dir, torch.bfloat16, compute)
    seen = _adapter_inputs(trainable)
    assert seen and set(seen) == {expected}
    assert {p.dtype for p in trainable.params} == {torch.float32}  # the adapters stay fp32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable.params)


def test_fp32_base_has_no_autocast(tiny_model_dir):
    trainable = _lora(tiny_model_dir, torch.float32, "base")
    assert trainable.compute_dtype is None
    assert set(_adapter_inputs(trainable)) == {torch.float32}


def test_adapter_gradients_agree_across_compute_dtypes(tiny_model_dir):
    grads = {}
    for compute in ("base", "float32"):
        trainable = _lora(tiny_model_dir, torch.bfloat16, compute)
        with torch.no_grad():  # non-zero lora_B, so lora_A gets a gradient
            for name, p in trainable.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).view_as(p))
        _adapter_inputs(trainable)
        grads[compute] = torch.cat([p.grad.flatten() for p in trainable.params])
    a, b = grads["base"], grads["float32"]
    assert a.norm() > 0
    assert float((a - b).norm() / b.norm()) < 0.05  # bf16 rounding, not a different gradient


def test_unknown_lora_compute_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="lora_compute"):
        _lora(tiny_model_dir, torch.float32, "fp8")


def test_lora_wrapping_raises_no_future_warning(tiny_model_dir):
    """peft reads transformers' deprecated ``is_gradient_checkpointing``: every run's log carried
    the FutureWarning it raises."""
    import warnings

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        build_trainable(base, "lora", rank=2, alpha=4, seed=0, device="cpu")
