"""A 2-rank gloo job killed as a whole mid-step, then resumed on 2 ranks, ends equal to an
uninterrupted 2-rank job.

Every rank runs 3 steps (``save_every=1``, ``trainer.resume=auto``) and gets
``SEARCHR1_KILL_AT=<point>@2``: at ``mid_rollout`` / ``after_update`` every rank SIGKILLs
itself; at ``engine_mid_write`` the rank inside the atomic write (rank 0, with every rank's
files in the temp folder under full fine-tuning) dies and the harness SIGKILLs the others, as
torchrun does when a worker dies (one that noticed the dead peer first exits 1, RankLost). The resume (same run dir, same N) must reach the
uninterrupted run's weights on every rank (LoRA adapters; under ``model.tuning=full`` every
weight, from the FSDP2 shards saved by ``torch.distributed.checkpoint``), its
``metrics.jsonl`` rows (one per step, none repeated or lost; wall times aside) and leave no
orphan temp folder. ``shard_mid_write`` kills every rank inside the sharded write itself
(``distributed/dcp.py``: the DCP shards written, the ranks' own files not), as ``kill -9`` of
the job would.
"""

from __future__ import annotations

import pytest
import torch

import searchr1.loop.checkpoint as ck
from tests.helpers.dist_run import join_whole_job, rows, start_job

WORLD, STEPS = 2, 3


def wall_clock(name: str) -> bool:
    return name.startswith("time/") or name.endswith(("latency", "tokens_per_second", "mfu"))


def job(model_dir, root, algo: str, kill_at: str | None = None) -> list[int | None]:
    env = {"SEARCHR1_KILL_AT": kill_at} if kill_at else {}
    procs = start_job(WORLD, model_dir, root / "run", root / "out", algo, 4, env=env,
                      steps=STEPS, save_every=1, resume="auto", eps=1e-6)
    return join_whole_job(procs, timeout=300)


def params(root, rank: int) -> dict:
    return torch.load(root / f"out/params_{rank}.pt")


def orphans(root) -> list[str]:
    ckpt = root / "run" / "checkpoints"
    found = [p for parent in (ckpt, ckpt / "engine/state", ckpt / "engine/sampler") if parent.is_dir()
             for p in parent.glob(".step_*")]
    return sorted(str(p.relative_to(ckpt)) for p in found)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    out = {}
    for algo in ("grpo", "grpo_full"):
        root = tmp_path_factory.mktemp(f"ref-{algo}")
        assert job(tiny_model_dir, root, algo) == [0] * WORLD
        out[algo] = root
    return out


CASES = [("grpo", "mid_rollout@2", ".step_"), ("grpo", "engine_mid_write@2", "engine/state/.step_000002."),
         ("grpo_full", "after_update@2", None), ("grpo_full", "engine_mid_write@2", "engine/state/.step_000002."),
         # inside the sharded write: every rank's DCP shard written, no rank's own file yet
         ("grpo_full", "shard_mid_write@2", "engine/state/.step_000002.")]
SHARDS, RANK_FILES = {".metadata", "__0_0.distcp", "__1_0.distcp"}, {"rank_0.pt", "rank_1.pt"}


@pytest.mark.parametrize("algo,kill_at,orphan", CASES)
def test_whole_job_sigkill_then_resume_equals_uninterrupted(tiny_model_dir, tmp_path, uninterrupted,
                                                            algo, kill_at, orphan):
    ref = uninterrupted[algo]
    codes = job(tiny_model_dir, tmp_path, algo, kill_at)
    # killed; a rank that saw its peer die first may have stopped on its own (RankLost: 1)
    assert codes[0] == -9 and all(c in (-9, 1) for c in codes), codes
    assert ck.newest_state(tmp_path / "run").step == 1  # step 2 never completed
    left = orphans(tmp_path)
    if orphan == "engine/state/.step_000002.":
        assert len(left) == 1 and left[0].startswith(orphan), left
        if algo == "grpo_full":  # every rank's shards were in the temp folder, none renamed
            names = {p.name for p in (tmp_path / "run/checkpoints" / left[0]).iterdir()}
            assert SHARDS <= names
            assert (RANK_FILES <= names) if kill_at.startswith("engine_mid_write") else not names & RANK_FILES
    else:
        assert left == []
    assert not list(tmp_path.glob("out/params_*.pt"))  # no rank finished

    assert job(tiny_model_dir, tmp_path, algo) == [0] * WORLD  # resume=auto, same N
    for r in range(WORLD):
        want, got = params(ref, r), params(tmp_path, r)
        assert want.keys() == got.keys()
        for k in want:
            assert torch.allclose(got[k], want[k], rtol=0, atol=1e-7), (r, k)
    assert orphans(tmp_path) == []
    got, want = rows(tmp_path), rows(ref)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        keys = {k for k in w if not wall_clock(k)}
        assert keys == {k for k in g if not wall_clock(k)}
        for k in keys:
            assert g[k] == pytest.approx(w[k], rel=1e-6, abs=1e-7), (w["step"], k)
