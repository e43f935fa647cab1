"""AdamW over the trained parameters: clipping, the step, and optimizer-state offload to CPU.

The optimizer state (AdamW's two moments) is the largest training buffer under full
fine-tuning (8 bytes per parameter in fp32). With ``offload`` the state lives in host memory
between steps: ``onload`` brings it to the parameters' device right before a step and
``offload`` sends it back afterwards (or when the rollout phase starts), so the GPU holds it
only while the update runs.
"""

from __future__ import annotations

import torch
from pytrio.types import AdamParams


class AdamW:
    """``torch.optim.AdamW`` driven by pytrio ``AdamParams`` (lr, betas, eps, decay, clip)."""

    def __init__(self, params: list[torch.nn.Parameter], offload: bool = False,
                 grad_sync=None, after_step=None) -> None:
        self.params = params
        self.grad_sync = grad_sync  # data parallel: sums the gradients over ranks
        self.after_step = after_step  # FSDP2: rebuild the full weights from the stepped shards
        self.offload_state = offload
        self.step_count = 0
        self.last_grad_norm: float | None = None
        self.torch = torch.optim.AdamW(params)
        self._on_host = False

    def reset(self) -> None:
        """Fresh moments and step count 0 (after loading weights without optimizer state)."""
        self.torch = torch.optim.AdamW(self.params)
        self.step_count = 0
        self._on_host = False

    def step(self, adam_params: AdamParams) -> dict[str, float]:
        """Clip the accumulated gradients, take one AdamW step, clear the gradients.

        ``grad_clip_norm`` 0 turns clipping off; ``grad_norm`` is the global L2 norm before
        clipping (what the remote engine reports).
        """
        self.onload()
        for group in self.torch.param_groups:
            group.update(
                lr=adam_params.learning_rate, betas=(adam_params.beta1, adam_params.beta2),
                eps=adam_params.eps, weight_decay=adam_params.weight_decay,
            )
        if self.grad_sync is not None:  # before clipping: the norm is the global gradient's
            self.grad_sync(self.params)
        grads = [p.grad for p in self.params if p.grad is not None]
        if adam_params.grad_clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, adam_params.grad_clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        self.torch.step()
        self.torch.zero_grad(set_to_none=True)
        if self.after_step is not None:
            self.after_step()
        self.step_count += 1
        self.last_grad_norm = float(_plain(norm))
        if self.offload_state:
            self.offload()
        return {"grad_norm": self.last_grad_norm, "learning_rate": adam_params.learning_rate,
                "step": float(self.step_count)}

    def state_dict(self) -> dict:
        return self.torch.state_dict()

    def load_state_dict(self, state: dict, step: int) -> None:
        """Replace the moments (as saved by ``state_dict``) and the step count."""
        self.reset()
        self.torch.load_state_dict(state)
        self.torch.zero_grad(set_to_none=True)
        self.step_count = step
        if self.offload_state:
            self.offload()

    def offload(self) -> None:
        """Move the moments to host memory (pinned on CUDA, for fast copies back)."""
        self._move(lambda t: _to_host(t))
        self._on_host = True

    def onload(self) -> None:
        """Move the moments back next to their parameters (no-op when already there)."""
        if not self._on_host:
            return
        by_param = {id(p): p for p in self.params}
        for param_id, state in ((id(p), self.torch.state[p]) for p in self.params if p in self.torch.state):
            device = by_param[param_id].device
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
        self._on_host = False

    def _move(self, fn) -> None:
        for state in self.torch.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = fn(value)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (the global norm over FSDP2 shards is a replicated one) as a plain tensor."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu":
        return t
    return t.to("cpu", non_blocking=False).pin_memory()
