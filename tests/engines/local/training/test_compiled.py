"""``engine.compile_layers``: compiled decoder layers give the eager passes' values and gradients."""

from __future__ import annotations

from pytrio.types import AdamParams

from searchr1.engines.local.training.compiled import compiled_layers
from searchr1.engines.local.training.recompute import decoder_layers
from tests.engines.local.training.test_client import batch, lora_grads, make_client, max_diff


def test_compiled_layers_match_eager_values_gradients_and_the_update(tmp_path):
    data = batch(4)
    eager = make_client(tmp_path / "e")
    compiled = make_client(tmp_path / "c", compile_layers=True, recompute=True)
    out_e = eager.forward_backward(data, "ppo").result()
    out_c = compiled.forward_backward(data, "ppo").result()
    for a, b in zip(out_e.loss_fn_outputs, out_c.loss_fn_outputs):
        assert max(abs(x - y) for x, y in zip(a["logprobs"].data, b["logprobs"].data)) < 1e-5  # float32 on the wire
    grads_e, grads_c = lora_grads(eager), lora_grads(compiled)
    scale = max(float(g.abs().max()) for g in grads_e.values())
    assert scale > 0 and max_diff(grads_e, grads_c) < 1e-6 * scale  # inductor reorders sums
    for client in (eager, compiled):
        client.optim_step(AdamParams(learning_rate=1e-2)).result()
    ref_e = eager.compute_reference_logprobs(data)  # a gradient-free pass, compiled too
    ref_c = compiled.compute_reference_logprobs(data)
    assert max(float((a - b).abs().max()) for a, b in zip(ref_e, ref_c)) < 1e-6
    # outside the training block the layers are the eager ones again (the sampler's)
    assert all("forward" not in layer.__dict__ for layer in decoder_layers(compiled.model))


def test_the_wrappers_last_and_leave_nothing_behind(tmp_path):
    client = make_client(tmp_path)
    with compiled_layers(client.model) as n:
        first = [layer.forward for layer in decoder_layers(client.model)]
    with compiled_layers(client.model):
        again = [layer.forward for layer in decoder_layers(client.model)]
    assert n == 2 and all(a is b for a, b in zip(first, again))  # one compile per layer, kept
    with compiled_layers(client.model, enabled=False) as none:
        assert none == 0
    assert all("forward" not in layer.__dict__ for layer in decoder_layers(client.model))
