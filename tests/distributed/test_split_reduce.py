"""Whole-group split, global mini-batches, metric reduction per kind, start-up checks."""

from __future__ import annotations

import itertools

import pytest

from searchr1.distributed.reduce import STEP, UPDATE, Kind, kind_of, reduce_gathered
from searchr1.distributed.split import check_split, global_minibatches, rank_block, split_questions
from searchr1.loop.update import minibatches


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_every_question_once_in_order_and_groups_whole(world):
    for n in range(0, 41):
        blocks = [list(rank_block(n, world, r)) for r in range(world)]
        assert [i for b in blocks for i in b] == list(range(n))  # each once, rank order = order
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
        questions = [f"q{i}" for i in range(n)]
        shares = [split_questions(questions, world, r) for r in range(world)]
        # a question is a group: its trajectories are sampled where it lands, so a group
        # spans ranks only if a question did — never: each is on exactly one rank
        assert sorted(q for s in shares for q in s) == sorted(questions)
        if n % world == 0:
            assert {len(s) for s in shares} == {n // world}
            assert check_split(n, world) is None


def test_uneven_split_is_refused_with_the_fix():
    msg = check_split(10, 4)
    assert "trainer.questions_per_step=8 or 12" in msg and "10" in msg
    assert check_split(10, 1) is None and check_split(12, 4) is None


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 7])
def test_global_minibatches_are_the_one_process_minibatches(size):
    for counts in itertools.product(range(4), repeat=3):
        total = sum(counts)
        firsts = [sum(counts[:r]) for r in range(3)]
        shares = [global_minibatches(list(counts), r, size) for r in range(3)]
        assert len({len(s) for s in shares}) == 1  # lockstep optimizer steps
        for k, part in enumerate(minibatches(total, size)):
            got = sorted(firsts[r] + i for r in range(3) for i in shares[r][k].local)
            assert got == part
            for r in range(3):
                sh = shares[r][k]
                assert sh.size == len(part)
                if sh.local:  # offset = position of the rank's first datum in the mini-batch
                    assert part.index(firsts[r] + sh.local[0]) == sh.offset


def test_metric_kinds_by_family():
    assert kind_of("time/rollout", STEP) == (Kind.MAX, None)
    assert kind_of("reward/world_1hop", STEP) == (Kind.MEAN, "source/world_1hop")
    assert kind_of("reward/mean", STEP) == (Kind.MEAN, "trajectories")
    assert kind_of("rollout/tool_error_rate", STEP) == (Kind.MEAN, "search_turns")
    assert kind_of("search/error_rate", STEP) == (Kind.FIRST, None)
    assert kind_of("train/loss_tokens_per_rollout_batch", STEP) == (Kind.SUM, None)
    assert kind_of("train/loss", UPDATE) == (Kind.SUM, None)
    assert kind_of("train/grad_norm", UPDATE) == (Kind.FIRST, None)
    assert kind_of("train/clip_fraction", UPDATE) == (Kind.MEAN, "tokens")


def test_reduce_by_kind_hand_computed():
    rows = [({"reward/mean": 0.5, "reward/s1": 1.0, "time/step_seconds": 2.0,
              "rollout/sampled_tokens": 10.0, "search/requests": 7.0, "train/update_skipped": 1.0},
             {"trajectories": 4, "source/s1": 1}),
            ({"reward/mean": 0.25, "reward/s1": 0.0, "time/step_seconds": 3.5,
              "rollout/sampled_tokens": 6.0, "search/requests": 7.0, "train/update_skipped": 0.0},
             {"trajectories": 4, "source/s1": 3})]
    out = reduce_gathered(rows, STEP)
    assert out["reward/mean"] == pytest.approx(0.375)
    assert out["reward/s1"] == pytest.approx(0.25)  # (1·1 + 0·3) / 4 trajectories of s1
    assert out["time/step_seconds"] == 3.5 and out["rollout/sampled_tokens"] == 16.0
    assert out["search/requests"] == 7.0 and out["train/update_skipped"] == 0.0
    upd = reduce_gathered([({"train/loss": 0.2, "train/clip_fraction": 0.5}, {"tokens": 30}),
                           ({}, {"tokens": 0}),  # an empty mini-batch share takes no part
                           ({"train/loss": -0.05, "train/clip_fraction": 0.0}, {"tokens": 10})], UPDATE)
    assert upd["train/loss"] == pytest.approx(0.15)  # loss shares add up
    assert upd["train/clip_fraction"] == pytest.approx(0.375)  # 15 clipped of 40 tokens


def test_loss_sum_is_the_global_mean_times_the_global_count():
    rows = [({"train/loss_mean": 0.1, "train/token_count": 30.0, "train/loss_sum": 99.0}, {"tokens": 30}),
            ({"train/loss_mean": 0.05, "train/token_count": 10.0, "train/loss_sum": 99.0}, {"tokens": 10})]
    out = reduce_gathered(rows, UPDATE)
    assert out["train/loss_sum"] == pytest.approx(0.15 * 40.0)


def test_sweep_wrapper_expands_like_hydra_and_runs_each_job_under_torchrun(tmp_path):
    from searchr1.distributed.sweep import expand, job_command

    jobs = expand(["rollout.group_size=2,4", "seed=0,1", "experiment=smoke"])
    assert sorted(map(tuple, jobs)) == sorted(
        (f"rollout.group_size={g}", f"seed={s}", "experiment=smoke") for g in (2, 4) for s in (0, 1))
    cmd = job_command(2, list(jobs[0]), tmp_path / "0", [])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[-1] == f"hydra.run.dir={tmp_path / '0'}" and "searchr1.main" in cmd
