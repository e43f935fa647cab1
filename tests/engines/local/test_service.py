"""The local service wires the engine's options into the training client it builds."""

from __future__ import annotations

import pytest

from searchr1.engines.local.config import LocalEngineConfig
from searchr1.engines.local.model import ModelConfig
from searchr1.engines.local.service import LocalService
from searchr1.engines.local.training.recompute import decoder_layers
from tests.engines.local.training.test_client import batch


@pytest.mark.parametrize("setting,recomputes", [(None, True), (True, True), (False, False)])
def test_activation_checkpointing_reaches_the_training_passes(tiny_model_dir, tmp_path, setting,
                                                               recomputes):
    """null = on for CPU; the switch recomputes each decoder layer in backward (its forward runs
    twice per pass), where transformers' own switch would do nothing in eval mode."""
    service = LocalService(LocalEngineConfig(device="cpu", activation_checkpointing=setting),
                           ModelConfig(name="tiny", hf_id=str(tiny_model_dir), gguf_file=None, lora_rank=4),
                           tmp_path)
    client = service.create_lora_training_client(rank=4, seed=0)
    assert client.passes.recompute is recomputes
    calls = []
    mlp = decoder_layers(client.model)[0].mlp  # entered inside the layer, so in its replay too
    hook = mlp.register_forward_pre_hook(lambda *_: calls.append(1))  # replays stop early
    client.forward_backward(batch(), "importance_sampling").result()
    hook.remove()
    assert len(calls) == (2 if recomputes else 1)
