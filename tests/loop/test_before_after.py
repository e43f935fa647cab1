"""The before/after table: each change with its paired bootstrap interval, and what the run shows."""

from __future__ import annotations

import json

from searchr1.loop.before_after import (before_after_report, change_intervals, format_before_after,
                                        paired_difference, run_note)

SOURCES = ("one", "two", "three", "four")


def records(ems: list[float], searches: int = 1) -> list[dict]:
    """Questions two per source, in a fixed order, with the given EM."""
    return [{"id": f"q{i}", "source": SOURCES[i // 2 % 4], "em": em, "format": 1.0,
             "searches": float(searches), "turns": 2.0} for i, em in enumerate(ems)]


def test_before_after_table_lists_each_metric_with_its_change():
    before = {"eval/em/macro": 0.1, "eval/format_rate": 0.4, "train/loss": 1.0}
    after = {"eval/em/macro": 0.25, "eval/format_rate": 0.9}
    lines = format_before_after(before, after, 3).splitlines()
    assert lines[0].split() == ["eval", "(dev)", "before", "step", "3", "change"]
    assert lines[1].split() == ["em/macro", "0.100", "0.250", "+0.150"]
    assert lines[2].split() == ["format_rate", "0.400", "0.900", "+0.500"]
    assert len(lines) == 3  # train metrics are not eval metrics


def test_a_quarter_point_change_on_eight_questions_is_inside_its_interval():
    """The default run's "em/macro 0.500 → 0.250": two answers of eight lost."""
    before = records([1, 0, 1, 0, 1, 0, 1, 0])
    after = records([1, 0, 0, 0, 1, 0, 0, 0])
    iv = change_intervals(before, after, ["em/macro", "em/one", "em/two", "format_rate", "searches"])
    low, high = iv["em/macro"]
    assert -0.6 < low < -0.25 < 0.0 < high < 0.2  # noise: the interval holds 0, ≈ 0.5 wide
    low, high = iv["em/two"]  # a source's EM 0.5 → 0: one of its two questions
    assert low < -0.7 and high > 0.0
    low, high = change_intervals(records([1, 1]), records([0, 0]), ["em/one"])["em/one"]  # 2 of 2
    assert low == -1.0 and high > 0.0  # the change seen stays inside; two questions decide nothing
    low, high = iv["format_rate"]  # identical before and after: a width, not [0, 0]
    assert -0.3 < low < -0.1 and 0.1 < high < 0.3
    assert "searches" not in iv  # counts, not yes/no: no interval


def test_a_consistent_change_on_many_questions_excludes_zero():
    before = records([0.0] * 200)
    after = records([1.0 if i % 4 else 0.0 for i in range(200)])
    low, high = change_intervals(before, after, ["em/macro"])["em/macro"]
    assert 0.65 < low <= high < 0.85


def test_the_macro_weighs_each_source_alike():
    """Sources of 1 and 3 questions: the lone question weighs as much as the other three."""
    rows = lambda ems: [{"id": f"q{i}", "source": "a" if i == 0 else "b", "em": em, "format": 1.0,
                         "searches": 1.0, "turns": 1.0} for i, em in enumerate(ems)]
    lone = paired_difference([1, 0, 0, 0], [0, 0, 0, 0], [2.0, 2 / 3, 2 / 3, 2 / 3])
    assert change_intervals(rows([1, 0, 0, 0]), rows([0, 0, 0, 0]), ["em/macro"])["em/macro"] == lone
    assert lone[0] < paired_difference([1, 0, 0, 0], [0, 0, 0, 0], [1.0] * 4)[0]  # wider below


def test_the_note_says_what_the_run_shows_and_where_learning_is_shown():
    rows = [{"train/loss_tokens_per_rollout_batch": 654.0, "rollout/degenerate_group_rate": 0.0,
             "reward/format": 1.0},
            {"train/loss_tokens_per_rollout_batch": 481.0, "rollout/degenerate_group_rate": 0.5,
             "reward/format": 0.875}]
    note = run_note(rows, 8, {"em/macro": (-0.75, 0.25)})
    assert "over the 8 dev questions, paired by question" in note
    assert "trained tokens 654 / 481" in note and "degenerate groups 0.00 / 0.50" in note
    assert "experiments/world_learning" in note
    assert "world_learning" not in run_note(rows, 8, {"em/macro": (0.1, 0.3)})  # learning shown


def test_report_reads_both_evals_trajectories(tmp_path):
    def write(name, ems):
        path = tmp_path / name / "trajectories.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps({"id": r["id"], "data_source": r["source"],
                                            "scores": {"em": r["em"], "format": 1.0},
                                            "num_searches": 1, "turns": [{}, {}]}) + "\n"
                                for r in records(ems)))
        return path

    b = write("b", [1, 0, 1, 0, 1, 0, 1, 0])
    a = write("a", [1, 0, 0, 0, 1, 0, 0, 0])
    text = before_after_report({"eval/em/macro": 0.5}, {"eval/em/macro": 0.25}, 3, b, a,
                               [{"train/loss_tokens_per_rollout_batch": 10.0}])
    first, second = text.splitlines()[:2]
    assert "95% interval" in first
    assert second.split()[:4] == ["em/macro", "0.500", "0.250", "-0.250"]
    assert "world_learning" in text
