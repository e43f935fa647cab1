"""Selection counts every trajectory whose update a length limit cuts (``train/skipped_overlong``):
a turn sampled from a cut context, or a turn running past ``trainer.max_datum_tokens``."""

from __future__ import annotations

from types import SimpleNamespace

from searchr1.advantages import ADVANTAGES
from searchr1.data.types import QAExample
from searchr1.loop.train_step import select_stage
from searchr1.rollout.config import RolloutConfig
import numpy as np

from searchr1.batch.shifted import lost_to_length, shifted_arrays, truncate
from searchr1.rollout.engine import RolloutEngine
from searchr1.rollout.types import Trajectory
from tests.helpers.rollout_fakes import CharProtocol, SlowRetriever, enc

GROUP_MEAN = ADVANTAGES.get("group_mean")


def _trained(t: Trajectory, n: int) -> float:
    """Trained tokens of ``t``'s datum cut at ``n`` positions."""
    a = truncate(shifted_arrays(t.tokens_T, t.mask_T, t.logprobs_T, np.zeros(len(t.tokens_T))), n)
    return a["mask"].sum()


EX = QAExample(id="q", question="?", golden_answers=("a",), data_source="t")


def _trajectory(engine: RolloutEngine, g: int, turns: list[tuple[str, bool]]) -> Trajectory:
    """Prompt ``Q:?|`` (4 tokens), then each (text, sampled from a cut context) turn recorded
    by the engine's own rule, with a 3-token observation after every turn but the last."""
    traj = Trajectory.start(EX, g, enc("Q:?|"))
    for i, (text, cut) in enumerate(turns):
        seq = SimpleNamespace(tokens=enc(text), logprobs=[-0.5] * len(text), text=text,
                              stop_reason="stop")
        engine.record_turn(traj, seq, truncated=cut)
        if i < len(turns) - 1:
            traj.append_observation(enc("[d]"))
    return traj


def test_cut_context_and_datum_limit_are_counted_and_short_ones_are_not():
    engine = RolloutEngine(CharProtocol(), SlowRetriever(0.0), topk=1, cfg=RolloutConfig())
    short = _trajectory(engine, 0, [("A:a;", False)])  # tokens 4..7
    cut = _trajectory(engine, 1, [("S:x;", False), ("A:b;", True)])  # turn 2 masked
    long = _trajectory(engine, 2, [("S:x;", False), ("A:cc;", False)])  # tokens 11..15
    for t, r in zip((short, cut, long), (1.0, 0.0, 0.5)):
        t.reward = r
    assert long.mask_T[11:16] == [1] * 5 and cut.mask_T[11:15] == [0] * 4
    # 15 datum positions train tokens 1..15: the whole of ``long``; 14 cut its last token
    assert not lost_to_length(long, 15) and lost_to_length(long, 14)
    assert lost_to_length(cut, None) and not lost_to_length(short, 7)
    sel = select_stage([[short, cut, long]], GROUP_MEAN, False, max_tokens=14)
    assert sel.skipped_overlong == 2 and len(sel.trajs_D) == 3
    # the datum indeed loses the last of its 9 sampled tokens at 14 positions
    assert [_trained(long, n) for n in (14, 15)] == [8, 9]
    assert select_stage([[short, cut, long]], GROUP_MEAN, False,
                        max_tokens=15).skipped_overlong == 1


def test_a_trajectory_left_with_no_trainable_token_is_counted_though_dropped():
    engine = RolloutEngine(CharProtocol(), SlowRetriever(0.0), topk=1, cfg=RolloutConfig())
    kept = _trajectory(engine, 0, [("A:a;", False)])
    empty = _trajectory(engine, 1, [("A:b;", True)])  # its only turn came from a cut context
    kept.reward, empty.reward = 1.0, 0.0
    sel = select_stage([[kept, empty]], GROUP_MEAN, False, max_tokens=100)
    assert sel.trajs_D == [kept] and sel.skipped_overlong == 1
