"""The paper's eval: em_format_paper against a reference of the official scorer, the Table 2
layout on scripted trajectories, and the same table from evaluate_split and compare."""

from __future__ import annotations

import asyncio
import json
import re

import pandas as pd
import pytest

from searchr1.analysis import compare
from searchr1.data.types import QAExample
from searchr1.loop.evaluate import evaluate_split
from searchr1.analysis.paper_table import format_paper_table, paper_em_metrics, table_row
from searchr1.protocols.tags import INVALID_ACTION_MESSAGE, TagsProtocol
from searchr1.protocols.tags_format import check_sequence
from searchr1.rewards import RewardConfig, RewardInput, build_reward
from searchr1.rewards.em_format_paper import em_format_paper_reward
from searchr1.rewards.normalize import exact_match, normalize_answer, sub_exact_match
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.scoring import eval_metrics
from searchr1.rollout.types import Trajectory
from searchr1.schemas import RolloutConfig
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever

SOURCES = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


class CharTok:
    """Code points as ids; a Qwen-like chat template so the official marker is present."""

    all_special_ids: list[int] = []
    chat_template = "qwen-like"

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"


# ------------------------------------------------- a reference of the official scorer


def official_reference(solution: str, golds: tuple[str, ...], structure=0.2, final=0.1,
                       retrieval=0.0) -> float:
    """``qa_em_format.compute_score_em`` restated from its documented behaviour."""
    marker = re.search(r"(<\|im_start\|>assistant|Assistant:)\s*", solution, re.IGNORECASE)
    content = solution[marker.end():] if marker else None
    balanced = content is not None and all(
        content.count(f"<{t}>") == content.count(f"</{t}>")
        for t in ("think", "search", "information", "answer"))
    valid = balanced and check_sequence(content)[0]
    blocks = re.findall(r"<information>(.*?)</information>", solution, re.DOTALL)
    retrieved = valid and any(normalize_answer(g) in normalize_answer(b.strip())
                              for b in blocks for g in golds)
    matches = re.findall(r"<answer>(.*?)</answer>", solution, re.DOTALL)
    answer = matches[-1].strip() if len(matches) >= 2 else None
    if answer is None:
        return structure + (retrieval if retrieved else 0.0) if valid else 0.0
    if exact_match(answer, golds):
        return 1.0 if valid else 1.0 - structure
    if valid:
        return structure + (retrieval if retrieved else 0.0)
    return final


INFO = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
CASES = [  # (turns, observations after all but the last turn, golds, official value)
    (["<think> t </think><answer> Paris </answer>"], [], ("Paris",), 1.0),
    (["<answer> Paris </answer>"], [], ("Paris",), 0.8),
    (["<think> t </think><answer> Lyon </answer>"], [], ("Paris",), 0.2),
    (["<answer> Lyon </answer> and more"], [], ("Paris",), 0.1),
    (["<think> t </think> I give up"], [], ("Paris",), 0.1),  # the 0.1 "no answer" cell
    (["<think> a </think><search> q </search>", "<think> b </think><answer> Lyon </answer>"],
     [INFO], ("Paris",), 0.2),
    (["<think> hm", "<think> x </think> still nothing"], [INVALID_ACTION_MESSAGE],
     ("Paris",), 0.1),
    (["<think> t </think> no answer"], [], ("Beijing",), 0.8),  # the prompt's example
]


@pytest.mark.parametrize("turns, observations, golds, expected", CASES)
@pytest.mark.parametrize("retrieval", [0.0, 0.1])
def test_em_format_paper_gives_the_official_value(turns, observations, golds, expected,
                                                  retrieval):
    proto = TagsProtocol(CharTok())
    prompt = proto.prompt_text("Where is the Louvre")
    response = "".join(t + o for t, o in zip(turns, [*observations, ""]))
    official = official_reference(prompt + response, golds, retrieval=retrieval)
    valid = proto.is_valid_format(turns, [*observations, ""])
    retrieved = any(sub_exact_match(o, golds) for o in observations)
    inp = RewardInput(proto.final_answer(turns), golds, valid, retrieved)
    ours = em_format_paper_reward(inp, retrieval_score=retrieval)
    assert ours == pytest.approx(official)
    if retrieval == 0.0:
        assert ours == pytest.approx(expected)


# ------------------------------------------------------------------ the Table 2 layout


def scripted(source: str, answer: str | None, gold: str, lab_em: float) -> Trajectory:
    ex = QAExample(id=f"{source}-{gold}", question="q?", golden_answers=(gold,),
                   data_source=source)
    traj = Trajectory.start(ex, 0, [1, 2, 3])
    traj.answer, traj.scores = answer, {"em": lab_em}
    return traj


TRAJS = [
    scripted("nq", "Paris", "Paris", 1.0), scripted("nq", "Lyon", "Paris", 0.0),
    scripted("triviaqa", "the Nile", "Nile", 1.0), scripted("popqa", "x", "y", 0.0),
    scripted("hotpotqa", None, "Beijing", 0.0),  # officially scored as the prompt example
    scripted("2wikimultihopqa", "a", "a", 1.0), scripted("musique", None, "b", 0.0),
    scripted("bamboogle", "c", "c", 1.0),
]


def test_table2_metrics_on_scripted_trajectories():
    m = paper_em_metrics(TRAJS)
    expected = {"nq": 0.5, "triviaqa": 1.0, "popqa": 0.0, "hotpotqa": 1.0,
                "2wikimultihopqa": 1.0, "musique": 0.0, "bamboogle": 1.0}
    assert {k: m[f"eval/paper_em/{k}"] for k in expected} == expected
    assert m["eval/paper_em/avg"] == pytest.approx(4.5 / 7)
    assert eval_metrics(TRAJS)["eval/em/macro"] == pytest.approx(3.5 / 7)  # lab: 0 on hotpotqa


def test_table2_layout_text():
    metrics = {**eval_metrics(TRAJS), **paper_em_metrics(TRAJS)}
    lines = format_paper_table(metrics).splitlines()
    assert lines[0] == "Search-R1 Table 2 layout (EM, official answer extraction)"
    assert lines[1].split() == ["NQ", "TriviaQA", "PopQA", "HotpotQA", "2wiki", "Musique",
                                "Bamboogle", "Avg.", "lab", "macro", "EM"]
    assert lines[2].split() == ["0.500", "1.000", "0.000", "1.000", "1.000", "0.000",
                                "1.000", "0.643", "0.500"]


def test_missing_benchmarks_show_a_dash_and_say_so():
    metrics = paper_em_metrics(TRAJS[:2])
    text = format_paper_table(metrics)
    assert "Avg. over the 1 benchmarks present" in text
    assert text.splitlines()[2].split()[:3] == ["0.500", "-", "-"]
    assert paper_em_metrics([scripted("world_1hop", "a", "a", 1.0)]) == {}
    assert format_paper_table({"eval/em/macro": 0.3}) == ""


def test_evaluate_split_writes_and_prints_the_paper_table(tmp_path, capsys):
    examples = [QAExample(id=f"{s}-1", question=s, golden_answers=("x",), data_source=s)
                for s in SOURCES]
    sampler = ScriptedSampler(lambda prompt, i: "A:y;" if prompt == "Q:nq|" else "A:x;")
    engine = RolloutEngine(CharProtocol(), SlowRetriever(0.0), topk=1, cfg=RolloutConfig())
    reward = build_reward(RewardConfig(name="em"))
    metrics = asyncio.run(evaluate_split(sampler, engine, examples, reward,
                                         SamplingSettings(0.0), tmp_path, progress=False))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval/paper_em/nq"] == 0.0 and summary["eval/paper_em/musique"] == 1.0
    assert summary["eval/paper_em/avg"] == pytest.approx(6 / 7) == metrics["eval/paper_em/avg"]
    assert summary["eval/em/macro"] == pytest.approx(6 / 7)
    assert "Search-R1 Table 2 layout" in capsys.readouterr().out


def test_compare_shows_the_table_for_a_sweep(tmp_path, capsys):
    for name, em in (("0", 0.25), ("1", 0.5)):
        run = tmp_path / "sweep" / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- rollout.group_size={4 + int(name)}\n")
        metrics = {f"eval/paper_em/{s}": em for s in SOURCES}
        metrics.update({"eval/paper_em/avg": em, "eval/em/macro": em - 0.05,
                        **{f"eval/em/{s}": em for s in SOURCES}})
        (run / "summary.json").write_text(json.dumps(metrics))
    assert compare.main([str(tmp_path / "sweep"), "--out", str(tmp_path / "cmp"),
                         "--no-plots"]) == 0
    frame = pd.read_csv(tmp_path / "cmp" / "paper_table.csv")
    assert list(frame.columns) == ["run", "rollout.group_size", "NQ", "TriviaQA", "PopQA",
                                   "HotpotQA", "2wiki", "Musique", "Bamboogle", "Avg.",
                                   "lab macro EM"]
    assert frame["Avg."].tolist() == [0.25, 0.5]
    assert frame["lab macro EM"].tolist() == pytest.approx([0.2, 0.45])
    assert "Search-R1 Table 2 layout (final EM)" in capsys.readouterr().out


def test_table_row_reads_a_metrics_dict():
    row = table_row({"eval/paper_em/nq": 0.4, "eval/paper_em/avg": 0.4})
    assert row["NQ"] == 0.4 and row["Avg."] == 0.4
    assert pd.isna(row["Bamboogle"]) and pd.isna(row["lab macro EM"])
