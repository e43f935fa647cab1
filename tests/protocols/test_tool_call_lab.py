"""The lab's protocol options on ``protocol=tool_call``: prompt texts, ``on_invalid=end`` and
the lab's answer rule, through the real Qwen3.5 chat template and the rollout engine.

The sampler here encodes scripted reply text with the test tokenizer (the replies end with
``<|im_end|>``, as a sampler stopping on it returns them), so the real protocol parses it.
"""

from __future__ import annotations

import asyncio

import pytest
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence

from searchr1.data.types import QAExample
from searchr1.protocols.tool_call import ToolCallConfig, ToolCallProtocol, system_text
from searchr1.rewards import RewardConfig, build_reward
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.scoring import score_trajectory
from searchr1.rollout.types import EndReason
from searchr1.rollout.config import RolloutConfig
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever, dec
from tests.protocols.test_tool_call import FIXTURES, make_tokenizer, xml_call

EX = QAExample(id="q1", question="Who wrote Hamlet?", golden_answers=("William Shakespeare",),
               data_source="nq")
GREEDY = SamplingSettings(temperature=0.0)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text())


class TokSampler:
    """Replies ``script(prompt_text, i)`` + ``<|im_end|>``, tokenised with ``tok``."""

    def __init__(self, tok, script) -> None:
        self.tok, self.script = tok, script
        self.prompts: list[str] = []

    async def sample_async(self, prompt, num_samples=1, sampling_params=None):
        text = self.tok.decode(prompt.to_ints(), skip_special_tokens=False)
        self.prompts.append(text)
        seqs = []
        for i in range(num_samples):
            reply = self.script(text, i) + "<|im_end|>"
            ids = self.tok.encode(reply, add_special_tokens=False)
            seqs.append(SampleSequence(stop_reason="stop", tokens=ids, text=reply,
                                       logprobs=[-0.1] * len(ids)))
        return SampleResponse(sequences=seqs)


def lab_protocol(tok, **kw) -> ToolCallProtocol:
    kw = {"system_prompt_file": "lab_system_prompt", "question_template": "{question}",
          "tool_description": "Look things up on the web.", "on_invalid": "end", **kw}
    cfg = ToolCallConfig(**kw)
    return ToolCallProtocol.from_config(cfg, tok)


def rollout(protocol, sampler, **limits):
    cfg = RolloutConfig(**{"max_searches": 4, "max_turns": 6, "max_trajectory_tokens": 4096,
                           "max_turn_tokens": 256, "max_observation_tokens": 512, **limits})
    engine = RolloutEngine(protocol, SlowRetriever(0.0), topk=1, cfg=cfg)
    return asyncio.run(engine.rollout_group(sampler, EX, 1, GREEDY))[0]


# ---- prompt options -------------------------------------------------------------------------


def test_lab_prompt_layout_system_example_and_bare_question(tok):
    proto = lab_protocol(tok)
    messages = proto.messages(EX.question)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == "Who wrote Hamlet?"
    assert messages[0]["content"].count("search for") == 2  # the worked two-search example
    text = tok.decode(proto.initial_prompt(EX.question), skip_special_tokens=False)
    assert "Look things up on the web." in text
    assert "Search for evidence. Returns" not in text  # our default description is replaced
    assert text.index("worked example") < text.index("Who wrote Hamlet?")


def test_default_prompt_has_no_system_message_and_our_instructions(tok):
    proto = ToolCallProtocol(tok)
    messages = proto.messages("Q?")
    assert [m["role"] for m in messages] == ["user"] and messages[0]["content"].endswith("Q?")
    assert proto.on_invalid == "retry"


def test_prompt_options_from_files_and_their_errors(tok, tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("  My own system text.\n")
    assert system_text(ToolCallConfig(system_prompt_file=str(path))) == "My own system text."
    with pytest.raises(ValueError, match="not both"):
        system_text(ToolCallConfig(system_prompt="a", system_prompt_file=str(path)))
    with pytest.raises(FileNotFoundError, match="no prompt text 'nope'"):
        system_text(ToolCallConfig(system_prompt_file="nope"))
    with pytest.raises(ValueError, match=r"must contain \{question\}"):
        ToolCallProtocol(tok, question_template="Q: ")
    with pytest.raises(ValueError, match="on_invalid"):
        ToolCallProtocol(tok, on_invalid="ignore")
    braces = ToolCallProtocol(tok, question_template='{"q": "{question}"}')  # no str.format
    assert braces.messages("x")[0]["content"] == '{"q": "x"}'


# ---- on_invalid -----------------------------------------------------------------------------


def test_invalid_turn_ends_the_trajectory_with_on_invalid_end(tok):
    script = lambda prompt, i: "I am not sure what to do."
    traj = rollout(lab_protocol(tok), TokSampler(tok, script))
    assert traj.end_reason is EndReason.INVALID and len(traj.turns) == 1
    assert traj.turns[0].observation_len == 0 and traj.mask_T[-1] == 1  # nothing appended
    score_trajectory(traj, lab_protocol(tok), build_reward(
        RewardConfig(name="em_format", answer_rule="lab", normalize="lab")))
    assert traj.reward == pytest.approx(-0.1) and traj.scores["format"] == 0.0


def test_invalid_turn_is_retried_with_on_invalid_retry(tok):
    def script(prompt, i):
        return "Answer: William Shakespeare" if "did not follow the format" in prompt else "hmm"

    traj = rollout(lab_protocol(tok, on_invalid="retry"), TokSampler(tok, script))
    assert traj.end_reason is EndReason.ANSWER and len(traj.turns) == 2


def test_engine_ends_on_invalid_only_when_the_protocol_says_so():
    class EndingCharProtocol(CharProtocol):
        on_invalid = "end"

    script = lambda prompt, i: "junk;" if "[" not in prompt else "A:x;"
    for proto, reason, turns in ((CharProtocol(), EndReason.ANSWER, 2),
                                 (EndingCharProtocol(), EndReason.INVALID, 1)):
        engine = RolloutEngine(proto, SlowRetriever(0.0), topk=1, cfg=RolloutConfig(max_turns=4))
        (traj,) = asyncio.run(engine.rollout_group(ScriptedSampler(script), EX, 1, GREEDY))
        assert (traj.end_reason, len(traj.turns)) == (reason, turns), dec(traj.tokens_T)


# ---- the lab's answer rule on whole trajectories ---------------------------------------------


LAB_REWARD = RewardConfig(name="em_format", answer_rule="lab", normalize="lab")
FINAL_TURNS = [
    # (final turn, lab reward, last_line reward)
    ("It is him.\nAnswer: William Shakespeare", 1.0, 1.0),
    ("Answer: Shakespeare", 0.0, 0.0),
    ("**Answer:** William Shakespeare", -0.1, 1.0),  # markdown label: not an answer in the lab
    ("Answer: Marlowe\nAnswer: William Shakespeare", -0.1, 1.0),  # two lines: invalid in the lab
    ("  Answer: William Shakespeare  ", 1.0, 1.0),
    ("answer: William Shakespeare", 1.0, 1.0),  # the lab's label ignores letter case
    ("Answer: “William Shakespeare”", 1.0, 0.0),  # curly quotes: stripped (unicode) vs kept
]


@pytest.mark.parametrize(("final", "lab", "last_line"), FINAL_TURNS)
def test_answer_rules_on_a_searched_trajectory(tok, final, lab, last_line):
    def script(prompt, i):
        return xml_call("Hamlet author") if "<tool_response>" not in prompt else final

    for cfg, expected in ((LAB_REWARD, lab), (RewardConfig(name="em_format"), last_line)):
        proto = lab_protocol(tok)
        traj = rollout(proto, TokSampler(tok, script))
        assert traj.num_searches == 1 and len(traj.turns) == 2
        score_trajectory(traj, proto, build_reward(cfg))
        assert traj.reward == pytest.approx(expected), (cfg.answer_rule, final)


def test_lab_rule_needs_the_tool_call_protocol():
    (traj,) = asyncio.run(RolloutEngine(CharProtocol(), SlowRetriever(0.0), 1, RolloutConfig())
                          .rollout_group(ScriptedSampler(lambda p, i: "A:x;"), EX, 1, GREEDY))
    with pytest.raises(ValueError, match="answer_rule=lab.*protocol=tool_call"):
        score_trajectory(traj, CharProtocol(), build_reward(LAB_REWARD))
