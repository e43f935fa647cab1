"""The lab's rules, one by one, where ours differ: eval selection, the answer rule, turn
parsing and the observation budget and texts (``experiment=lab`` selects each of them).

Expected values are re-derived here from the rules as the lab's code states them (read in
llm-agent-rl-lab 03-search-r1: prepare_data.py, reward.py, protocol.py, rollout.py), written
independently and simply, plus a few values checked by hand.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from searchr1.data.selection import select_examples
from searchr1.data.types import QAExample
from searchr1.protocols.base import ActionKind, Observation, ObservationOverflow
from searchr1.protocols.observation_text import load_observation_texts
from searchr1.protocols.tool_call import ToolCallConfig
from searchr1.protocols.tool_call_text import prompt_texts
from searchr1.retrievers.zhihu import ZhihuRetriever
from searchr1.retrievers.base import Document
from searchr1.rewards import RewardConfig, build_reward
from searchr1.rewards.answer_rule import lab_answer
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.scoring import score_trajectory
from searchr1.rollout.types import EndReason
from searchr1.rollout.config import RolloutConfig
from tests.helpers.rollout_fakes import SlowRetriever
from tests.protocols.test_tool_call_lab import TokSampler, lab_protocol, tok  # noqa: F401  (fixture)
from tests.protocols.test_tool_call import json_call, xml_call

# ---- 11. eval selection ------------------------------------------------------------------

# test.parquet-shaped: benchmarks of unequal size, contiguous blocks, file order not sorted
SOURCES = {"nq": 36, "triviaqa": 41, "popqa": 29, "hotpotqa": 33, "2wikimultihopqa": 27,
           "musique": 18, "bamboogle": 12}


@pytest.fixture(scope="module")
def pool() -> list[QAExample]:
    names = [name for name, n in SOURCES.items() for _ in range(n)]
    return [QAExample(id=f"test_{i}", question=f"q{i}", golden_answers=("x",), data_source=s)
            for i, s in enumerate(names)]


def labs_seventy(rows: list[QAExample], k: int = 10, seed: int = 42) -> list[str]:
    """prepare_data.select_dev as a rule: one Random(seed); sources in sorted order; each
    source's rows (file order) shuffled by it in turn; the first k of each kept."""
    rng = random.Random(seed)
    ids: list[str] = []
    for source in sorted({r.data_source for r in rows}):
        block = [r.id for r in rows if r.data_source == source]
        rng.shuffle(block)
        ids += block[:k]
    return ids


def test_lab_selection_is_one_generator_over_sorted_sources(pool):
    picked = [ex.id for ex in select_examples(pool, per_source=10, selection="lab", seed=42)]
    assert picked == labs_seventy(pool) and len(set(picked)) == 70
    # checked by hand: 2wikimultihopqa (rows 139-165) comes first, bamboogle (184-195)
    # second, triviaqa (36-76) last
    assert picked[:3] == ["test_155", "test_151", "test_148"]
    assert picked[10:12] == ["test_189", "test_195"] and picked[-2:] == ["test_44", "test_63"]
    fresh = select_examples(pool, per_source=10, selection="per_source_seed", seed=42)
    assert {ex.id for ex in fresh} != set(picked)  # the old rule: a fresh Random per source


def test_lab_selection_depends_on_the_sources_sorted_before(pool):
    """One shared generator: dropping the first sorted source moves every later pick."""
    without = [ex for ex in pool if ex.data_source != "2wikimultihopqa"]
    picked = [ex.id for ex in select_examples(without, 10, "lab")]
    assert picked == labs_seventy(without) and picked != labs_seventy(pool)[10:]


# ---- 12. the answer rule -----------------------------------------------------------------

ANSWERS = [  # (final turn, the lab's answer)
    ("answer: Paris", "Paris"),
    ("ANSWER: Paris", "Paris"),
    ("Answer:\nParis", "Paris"),  # the value on the next line
    ("Answer:  \n\n   Paris  \nmore text", "Paris"),  # blank lines skipped
    ("I think so.\n  aNsWeR:Paris", "Paris"),
    ("Answer: Lyon\nanswer: Paris", None),  # two label lines
    ("Answer:\nAnswer: Paris", "Answer: Paris"),  # the next line is the value, used up
    ("Answer:", None),
    ("Answer:\n\n", None),
    ("**Answer:** Paris", None),
    ("The answer: Paris", None),
]


@pytest.mark.parametrize(("text", "answer"), ANSWERS)
def test_lab_answer_rule(text, answer):
    assert lab_answer(text) == answer


@pytest.mark.parametrize("final", ["answer: Paris", "ANSWER: Paris", "Answer:\nParis"])
def test_lab_reward_scores_these_one(tok, final):  # noqa: F811
    def script(prompt, i):
        return xml_call("capital of France") if "<tool_response>" not in prompt else final

    proto = lab_protocol(tok, parse_rule="lab")
    traj = run(proto, TokSampler(tok, script))
    reward = build_reward(RewardConfig(name="em_format", answer_rule="lab", normalize="lab"))
    score_trajectory(traj, proto, reward)
    assert (traj.answer, traj.reward, traj.scores["format"]) == ("Paris", 1.0, 1.0)


# ---- 13. parsing -------------------------------------------------------------------------

EX = QAExample(id="q", question="What is the capital of France?", golden_answers=("Paris",),
               data_source="nq")


def run(protocol, sampler, retriever=None, **limits):
    cfg = RolloutConfig(**{"max_searches": 4, "max_turns": 6, "max_trajectory_tokens": 4096,
                           "max_turn_tokens": 256, "max_observation_tokens": 512, **limits})
    engine = RolloutEngine(protocol, retriever or SlowRetriever(0.0), topk=3, cfg=cfg)
    return asyncio.run(engine.rollout_group(sampler, EX, 1, SamplingSettings(0.0)))[0]


TURNS = [  # (turn, kind under parse_rule=lab, kind under ours)
    (json_call("France capital"), ActionKind.INVALID, ActionKind.SEARCH),
    (xml_call("a < b"), ActionKind.INVALID, ActionKind.SEARCH),
    (xml_call("<b>France</b>"), ActionKind.INVALID, ActionKind.SEARCH),
    ("Answer: Paris\n" + xml_call("France capital"), ActionKind.SEARCH, ActionKind.INVALID),
    ("Let me look.\n" + xml_call("France capital"), ActionKind.SEARCH, ActionKind.SEARCH),
    (xml_call("a") + "\n" + xml_call("b"), ActionKind.INVALID, ActionKind.INVALID),
    (xml_call("France") + " then", ActionKind.INVALID, ActionKind.INVALID),
    ("<tool_call>junk</tool_call>\nAnswer: Paris", ActionKind.INVALID, ActionKind.INVALID),
    ("Answer: Paris", ActionKind.ANSWER, ActionKind.ANSWER),
    ("It is Paris.", ActionKind.ANSWER, ActionKind.INVALID),  # the lab: a final turn
]


@pytest.mark.parametrize(("turn", "lab", "ours"), TURNS)
def test_parse_rules(tok, turn, lab, ours):  # noqa: F811
    text = turn + "<|im_end|>"
    assert lab_protocol(tok, parse_rule="lab").parse_action(text).kind is lab
    assert lab_protocol(tok).parse_action(text).kind is ours


def test_answer_line_before_a_call_searches_in_the_lab(tok):  # noqa: F811
    def script(prompt, i):
        if "<tool_response>" not in prompt:
            return "Answer: Lyon\n" + xml_call("France capital")
        return "Answer: Paris"

    lab = run(lab_protocol(tok, parse_rule="lab"), TokSampler(tok, script))
    assert (lab.num_searches, lab.end_reason, len(lab.turns)) == (1, EndReason.ANSWER, 2)
    ours = run(lab_protocol(tok), TokSampler(tok, script))
    assert (ours.num_searches, ours.end_reason, len(ours.turns)) == (0, EndReason.INVALID, 1)


def test_a_json_call_ends_the_lab_trajectory_and_scores_its_answer_line(tok):  # noqa: F811
    """The lab scores the final turn's text whatever ended it: an ``Answer:`` line beside a
    malformed call still counts."""
    turn = "Answer: Paris\n" + json_call("France capital")
    proto = lab_protocol(tok, parse_rule="lab")
    traj = run(proto, TokSampler(tok, lambda p, i: turn))
    assert (traj.num_searches, traj.end_reason) == (0, EndReason.INVALID)
    score_trajectory(traj, proto, build_reward(RewardConfig(name="em_format", answer_rule="lab")))
    assert traj.reward == 1.0


def test_an_observation_that_fills_the_budget_exactly_leaves_the_lab_no_answer(tok):  # noqa: F811
    """The lab's rollout.py: a search turn that also writes an `Answer:` line searches; its
    observation is kept when the next prompt is at most max_trajectory_tokens long; the next
    request then has max_tokens 0, the trajectory ends with final_text still "", and
    score_answer("") is the −0.1 of no answer. With one token more room it scores the
    final turn it samples."""
    first = "Answer: Paris\n" + xml_call("capital of France")
    script = lambda p, i: first if "<tool_response>" not in p else "Answer: Paris"  # noqa: E731
    proto = lab_protocol(tok, parse_rule="lab", on_observation_overflow="end")
    reward = build_reward(RewardConfig(name="em_format", answer_rule="lab", normalize="lab"))
    free = run(proto, TokSampler(tok, script))
    filled = len(free.tokens_T) - len(free.turns[1].sampled_tokens)  # prompt, turn, observation
    exact = run(proto, TokSampler(tok, script), max_trajectory_tokens=filled)
    assert (exact.end_reason, exact.num_searches, len(exact.tokens_T)) == (
        EndReason.TOKEN_LIMIT, 1, filled)
    score_trajectory(exact, proto, reward)
    assert (exact.answer, exact.reward, exact.scores["format"]) == (None, -0.1, 0.0)
    for traj in (free, run(proto, TokSampler(tok, script), max_trajectory_tokens=filled + 1)):
        score_trajectory(traj, proto, reward)
        assert (traj.answer, traj.reward, len(traj.turns)) == ("Paris", 1.0, 2)


# ---- 14. observations: the budget rule and the texts ------------------------------------

class FixedRetriever(SlowRetriever):
    """Returns ``docs`` for every query."""

    def __init__(self, docs: list[Document]) -> None:
        super().__init__(0.0)
        self.docs = docs

    async def _search(self, queries, topk):
        return [list(self.docs) for _ in queries]


def doc(title: str, chars: int) -> Document:
    return Document(f"id-{title}", title, ("word " * chars)[:chars], url="https://x.org/a",
                    source="web")


def test_first_result_over_budget_ends_the_trajectory(tok):  # noqa: F811
    big = FixedRetriever([doc("Big", 3000)])
    script = lambda p, i: xml_call("France") if "<tool_response>" not in p else "Answer: Paris"
    lab = run(lab_protocol(tok, on_observation_overflow="end"), TokSampler(tok, script), big)
    assert lab.end_reason is EndReason.OBSERVATION_LIMIT and len(lab.turns) == 1
    assert lab.turns[0].observation_len == 0 and lab.num_searches == 0
    assert len(lab.tokens_T) == lab.prompt_len + len(lab.turns[0].sampled_tokens)
    ours = run(lab_protocol(tok), TokSampler(tok, script), big)  # cut: the result is cut
    assert ours.end_reason is EndReason.ANSWER and ours.num_searches == 1
    assert ours.turns[0].observation_len <= 512 and "Title: Big" in ours.turns[0].observation_text


def test_whole_results_counted_on_the_text_alone(tok):  # noqa: F811
    """Results are kept whole while the joined text's own tokens fit; framing not counted."""
    proto = lab_protocol(tok, on_observation_overflow="end")
    three = (doc("A", 200), doc("B", 200), doc("C", 200))
    texts = load_observation_texts()
    two_text = texts.separator.join(texts.result_blocks(list(three[:2]), 1200))
    budget = len(tok.encode(two_text, add_special_tokens=False))
    tokens, text = proto.fit_observation([], Observation(documents=three), budget, 10_000)
    assert "Title: B" in text and "Title: C" not in text and len(tokens) > budget
    with pytest.raises(ObservationOverflow):  # the trajectory's room is a limit as well
        proto.fit_observation([], Observation(documents=three), budget, 20)
    cut, _ = lab_protocol(tok).fit_observation([], Observation(documents=three), budget, 10)
    assert len(cut) <= budget  # ours: the whole observation within the budget, cut to fit


def test_default_observation_texts_are_ours(tok):  # noqa: F811
    proto = lab_protocol(tok)
    d = Document("1", "", "Paris is the capital.", url="https://x.org", source="")
    _, text = proto.observation_tokens([], Observation(documents=(d,)), 1000)
    assert "[1] Title: (untitled)\nContent: Paris is the capital.\nURL: https://x.org" in text
    assert "Source:" not in text  # optional line, empty field
    _, failed = proto.observation_tokens([], Observation(error="timeout"), 1000)
    assert "The search failed (timeout). Try another query or answer." in failed


def test_observation_template_file_replaces_the_texts(tok, tmp_path):  # noqa: F811
    path = tmp_path / "obs.yaml"
    path.write_text('result: ["<{index}> {title}", "    Body: {content}", "    From: {source}"]\n'
                    'separator: "\\n---\\n"\nerror: "Search error: {error}"\n'
                    'no_results: "Nothing."\n')
    proto = lab_protocol(tok, observation_template_file=str(path))
    docs = (Document("1", "Paris", "Capital.", source="wiki"), Document("2", "Lyon", "City."))
    _, text = proto.observation_tokens([], Observation(documents=docs), 1000)
    assert "<1> Paris\n    Body: Capital.\n    From: wiki\n---\n<2> Lyon\n    Body: City." in text
    _, failed = proto.observation_tokens([], Observation(error="HTTP 500"), 1000)
    assert "Search error: HTTP 500" in failed
    _, none = proto.observation_tokens([], Observation(documents=()), 1000)
    assert "Nothing." in none and "Your previous turn" in proto.texts.invalid  # kept ours


ZHIHU_ITEMS = [  # Data.Items rows: both fields, no ContentType, no AuthorName
    {"Title": "A", "ContentText": "x", "Url": "https://z/1", "ContentType": "answer",
     "AuthorName": "Alice"},
    {"Title": "B", "ContentText": "y", "Url": "https://z/2", "AuthorName": "Bob"},
    {"Title": "C", "ContentText": "z", "Url": "https://z/3", "ContentType": "article"},
]


def labs_source(item: dict) -> str:
    """search.py _parse_item as a rule: the ContentType, or the word the lab puts for a
    missing one, then " / " and the AuthorName when there is one."""
    parts = [item.get("ContentType") or "Zhihu"] + ([item["AuthorName"]] if item.get("AuthorName") else [])
    return " / ".join(parts)


def test_the_source_line_is_the_templates_to_write(tok, tmp_path):  # noqa: F811
    docs = [ZhihuRetriever(keys=["k-1"])._document(item) for item in ZHIHU_ITEMS]
    ours = load_observation_texts()
    assert [ours.source_text(d) for d in docs] == [
        "zhihu/answer / Alice", "zhihu/unknown / Bob", "zhihu/article"]  # our default
    path = tmp_path / "source.yaml"
    path.write_text('source: ["{kind}", " / {author}"]\nno_kind: "Zhihu"\n')
    texts = load_observation_texts(str(path))
    labs = [labs_source(item) for item in ZHIHU_ITEMS]
    assert [texts.source_text(d) for d in docs] == labs == [
        "answer / Alice", "Zhihu / Bob", "article"]
    _, text = lab_protocol(tok, observation_template_file=str(path)).observation_tokens(
        [], Observation(documents=tuple(docs)), 1000)
    assert "Source: answer / Alice\nURL: https://z/1" in text and "Source: article\n" in text


def test_the_query_parameter_description_is_an_option(tok):  # noqa: F811
    ours = tok.decode(lab_protocol(tok).initial_prompt("Q?"), skip_special_tokens=False)
    assert '"description": "A concise search query."' in ours
    proto = lab_protocol(tok, query_description="One short query in English.")
    text = tok.decode(proto.initial_prompt("Q?"), skip_special_tokens=False)
    assert '"description": "One short query in English."' in text
    assert "A concise search query." not in text
    assert prompt_texts(ToolCallConfig(query_description="One short query in English."))[
        "query"] == "One short query in English."


@pytest.mark.parametrize(("body", "match"), [
    ("titel: x\n", "unknown keys"),
    ('result: ["{name}"]\n', "unknown fields"),
    ('error: "{query}"\n', "unknown fields"),
    ("result: one line\n", "must be a list"),
    ("result: [\n", "not valid YAML"),
    ('source: ["{title}"]\n', "unknown fields"),
    ("source: '{kind}'\n", "must be a list"),
])
def test_bad_observation_templates(tmp_path, body, match):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        load_observation_texts(str(path))
    with pytest.raises(FileNotFoundError, match="observation_template_file"):
        load_observation_texts(str(tmp_path / "missing.yaml"))

