"""N gloo ranks on half (a third) of the batch each give the one-process update on all of it.

Each case runs the real trainer for 2 steps of 2 optimizer steps (mini-batch = half the
trajectories) once as one process and once as a 2- or 3-rank gloo job on the same global
batch: GRPO with the paper's micro-batch token mean (loss micro-batches of 3 that straddle
ranks), PPO with its critic (GAE whitened over all ranks, the critic's micro-batches global),
and the lab's algorithm (per-datum scale, seq_mean_token_mean); and GRPO under
``model.tuning=full`` on FSDP2 (every weight of each rank's full copy). Every trained
parameter (adapters, the critic's, or every weight) must match to 1e-4 of its norm and every
metric of ``metrics.jsonl`` (written by rank 0 alone) must match, wall-clock times aside.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.dist_run import rows, run_job


#: sizes of the engine's packing plan: each rank packs its own datums into micro-batches
PLAN = ("train/padded_tokens_per_rollout_batch", "train/micro_batches_per_step",
        "train/max_micro_batch_padded_tokens")


def wall_clock(name: str) -> bool:
    """Wall time, or the per-rank packing plan (neither is part of the update)."""
    return name.startswith("time/") or name.endswith(("latency", "tokens_per_second", "mfu")) or name in PLAN


def assert_params_equal(a: dict, b: dict, initial: dict | None = None) -> None:
    assert a.keys() == b.keys()
    if initial is None:
        assert max(float(v.abs().max()) for k, v in a.items() if "lora_B" in k) > 0  # it trained
    else:  # full fine-tuning: every weight moved
        assert all(not torch.equal(a[k], initial[k]) for k in a), "a weight did not train"
    for k in a:
        # Relative to the tensor's norm. AdamW divides by sqrt(v), so an element whose gradient
        # is ~0 turns summation-order noise into a visible update: the worst tensor differs by
        # 1.1e-5 of its norm on a 2-core Xeon VM (2.3e-5 with Adam eps 1e-5; 2 of its 256
        # elements carry most of it). A lost or doubled share changes the gradient's direction
        # and so every element's update (lr 5e-2 per step); a wrong constant normaliser, which
        # Adam would hide, shows in the logged loss, compared to 1e-5 by assert_rows_equal.
        scale = float(a[k].norm()) or 1.0
        assert float((a[k] - b[k]).norm()) <= 1e-4 * scale, k


def assert_rows_equal(one: list[dict], many: list[dict]) -> None:
    assert [r["step"] for r in one] == [r["step"] for r in many]
    for r1, rn in zip(one, many):
        keys = {k for k in r1 if not wall_clock(k)}
        assert keys == {k for k in rn if not wall_clock(k)}
        for k in keys:
            assert rn[k] == pytest.approx(r1[k], rel=1e-5, abs=1e-6), (r1["step"], k)


@pytest.mark.parametrize("algo,world", [("grpo", 2), ("grpo", 3), ("ppo", 2), ("lab", 3), ("grpo_recompute", 3)])
def test_n_ranks_equal_one_process(tiny_model_dir, tmp_path, algo, world):
    questions = 6 if world == 3 else 4
    one = run_job(1, tiny_model_dir, tmp_path / "one", algo, questions, eps=1e-6)
    many = run_job(world, tiny_model_dir, tmp_path / "many", algo, questions, eps=1e-6)
    # (Adam's eps is 1e-6 in these runs: with 1e-8 an element whose gradient is ~1e-9 turns
    # summation-order noise of 1e-16 into update noise of 1e-6 — Adam's, not the split's.)
    p1 = torch.load(one / "out/params_0.pt")
    for r in range(world):  # every replica holds the same weights
        assert_params_equal(p1, torch.load(many / f"out/params_{r}.pt"))
    assert_rows_equal(rows(one), rows(many))
    assert not (many / "out/params_1.pt").samefile(many / "out/params_0.pt")


#: uneven shares: mini-batches of 3 over 2 ranks × 4 datums, one datum per micro-batch, so
#: the ranks run 3/0, 1/2 and 0/2 gradient passes (an empty share, then uneven counts)
UNEVEN = {"minibatch_trajectories": 3, "max_datums_per_microbatch": 1}


@pytest.mark.parametrize("uneven", [False, True])
def test_full_finetuning_fsdp2_two_ranks_equal_one_process(tiny_model_dir, tmp_path, uneven):
    """model.tuning=full: 2 ranks on FSDP2 (gradient passes through the sharded units,
    reduce-scatters made sums, AdamW on the shards, full weights gathered after each step)
    give the one-process update and rows; with uneven shares the ranks stay in lockstep
    through zero-loss passes."""
    from safetensors.torch import load_file

    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    kw = dict(UNEVEN if uneven else {}, eps=1e-6)
    one = run_job(1, tiny_model_dir, tmp_path / "one", "grpo_full", 4, **kw)
    many = run_job(2, tiny_model_dir, tmp_path / "many", "grpo_full", 4, **kw)
    idle = [int((many / f"out/idle_{r}.txt").read_text()) for r in range(2)]
    assert sum(idle) > 0, idle  # the ranks' pass counts differed: the lockstep padded them
    p1 = torch.load(one / "out/params_0.pt")
    assert p1.keys() == initial.keys()
    for r in range(2):  # every rank's gathered full copy
        assert_params_equal(p1, torch.load(many / f"out/params_{r}.pt"), initial)
    assert_rows_equal(rows(one), rows(many))
    shards = list((many / "run/checkpoints/engine/state/step_000002").iterdir())
    assert {p.name for p in shards} >= {".metadata", "rank_0.pt", "rank_1.pt"}  # DCP, sharded
