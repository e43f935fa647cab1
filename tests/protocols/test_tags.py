"""The paper's tag protocol: prompt, action parsing, observation rendering and format check."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from searchr1.protocols.base import PROTOCOLS, ActionKind, Observation
from searchr1.protocols.tags import (
    INVALID_ACTION_MESSAGE,
    TagsConfig,
    TagsProtocol,
    check_sequence,
)
from searchr1.retrievers.base import Document

INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

DOCS = (
    Document("1", "Paris", "Paris is the capital of France."),
    Document("2", "Lyon", "Lyon is in France.\nIt has two rivers."),
    Document("3", "Nice", "Nice lies on the French Riviera."),
)

TRAIN_TEXT = [
    "<think> I need to search. </think> <search> capital of France </search>",
    "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.\n</information>\n\n",
    "<answer> Paris </answer> Question: Who wrote Hamlet? The quick brown fox.",
] * 4


@pytest.fixture(scope="module")
def tokenizer():
    """A tiny byte-level BPE (lossless round trip) with a toy chat template; no network."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    hf.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return hf


@pytest.fixture()
def proto(tokenizer):
    return TagsProtocol(tokenizer, use_chat_template=False)


def test_registered_config_and_stop():
    assert PROTOCOLS.get("tags") is TagsProtocol
    assert TagsConfig() == TagsConfig(name="tags", use_chat_template=None)
    assert TagsProtocol.stop == ["</search>", "</answer>"]


def test_prompt_contains_question_and_tags(proto, tokenizer):
    ids = proto.initial_prompt("Who wrote Hamlet?")
    text = tokenizer.decode(ids)
    assert text.endswith("Question: Who wrote Hamlet?\n")
    for tag in [
        "<think>",
        "</think>",
        "<search> query </search>",
        "<information>",
        "</information>",
        "<answer> Beijing </answer>",
    ]:
        assert tag in text
    assert text.count("<answer> Beijing </answer>") == 1


def test_chat_template_is_used_whenever_the_tokenizer_has_one(tokenizer):
    # Search-R1's data code: the template wraps the prompt whenever one exists (auto = None)
    assert TagsProtocol(tokenizer).use_chat_template is True
    tokenizer_without = type(tokenizer).__new__(type(tokenizer))
    tokenizer_without.__dict__.update(tokenizer.__dict__)
    tokenizer_without.chat_template = None
    assert TagsProtocol(tokenizer_without).use_chat_template is False


def test_prompt_with_chat_template(tokenizer):
    proto = TagsProtocol(tokenizer, use_chat_template=True)
    text = tokenizer.decode(proto.initial_prompt("Who wrote Hamlet?"))
    assert text.startswith("<|user|>Answer the question")
    assert text.endswith("Question: Who wrote Hamlet?\n<|end|>\n<|assistant|>")


@pytest.mark.parametrize(
    "text, kind, value, error",
    [
        (
            "<think> hm </think>\n<search> capital of France </search>",
            "search",
            "capital of France",
            None,
        ),
        ("<think> ok </think> <answer> Paris </answer>", "answer", "Paris", None),
        (
            "<search>\n  first line\n  second line\n</search>",
            "search",
            "first line\n  second line",
            None,
        ),
        ("<search> \n\t </search>", "invalid", None, "empty query"),
        ("<answer>   </answer>", "answer", "", None),
        (
            "<think> I should search for the capital",
            "invalid",
            None,
            "no <search> or <answer> block",
        ),
        ("<search> capital of France", "invalid", None, "missing closing tag </search>"),
        (
            "<search> a </search> <answer> b </answer>",
            "search",
            "a",
            "multiple actions (2); the first is used",
        ),
        (
            "<answer> b </answer><search> a </search>",
            "answer",
            "b",
            "multiple actions (2); the first is used",
        ),
        # nested, outer closed: the lazy match runs to the first </search>
        ("<search> a <answer> b </answer> </search>", "search", "a <answer> b </answer>", None),
        # nested, outer never closed (generation stopped at </answer>): the inner answer wins
        ("<search> a <answer> b </answer>", "answer", "b", None),
        ("<SEARCH> a </SEARCH>", "invalid", None, "no <search> or <answer> block"),
    ],
)
def test_parse_action(proto, text, kind, value, error):
    action = proto.parse_action(text)
    assert action.kind == ActionKind(kind)
    assert (action.query if kind == "search" else action.answer) == value
    assert action.error == error


def test_observation_two_docs_byte_for_byte(proto, tokenizer):
    expected = (
        "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.\n"
        "Doc 2(Title: Lyon) Lyon is in France.\nIt has two rivers.</information>\n\n"
    )
    tokens, text = proto.observation_tokens([1, 2], Observation(documents=DOCS[:2]), 10_000)
    assert text == expected
    assert tokens == tokenizer.encode(expected, add_special_tokens=False)
    assert tokenizer.decode(tokens) == expected


def test_truncation_drops_whole_passages_first(proto):
    two_tokens, two_text = proto.observation_tokens([], Observation(documents=DOCS[:2]), 10_000)
    tokens, text = proto.observation_tokens([], Observation(documents=DOCS), len(two_tokens))
    assert (tokens, text) == (two_tokens, two_text)
    assert "Doc 3" not in text


def test_truncation_cuts_a_single_long_passage(proto, tokenizer):
    long_doc = Document("9", "Long", " ".join(["capital of France"] * 60))
    full, _ = proto.observation_tokens([], Observation(documents=(long_doc,)), 10_000)
    tokens, text = proto.observation_tokens([], Observation(documents=(long_doc, DOCS[0])), 30)
    close = tokenizer.encode("</information>\n\n", add_special_tokens=False)
    assert len(tokens) == 30
    assert tokens[-len(close) :] == close
    assert tokens[: 30 - len(close)] == full[: 30 - len(close)]
    assert text.startswith("\n\n<information>Doc 1(Title: Long) capital")
    assert text.endswith("</information>\n\n") and "Doc 2" not in text


def test_invalid_and_error_observations(proto, tokenizer):
    assert INVALID_ACTION_MESSAGE == INVALID
    tokens, text = proto.observation_tokens([], Observation(invalid=True), 10_000)
    assert text == INVALID and tokens == tokenizer.encode(INVALID, add_special_tokens=False)
    _, text = proto.observation_tokens([], Observation(error="search timed out"), 10_000)
    assert text == "\n\n<information>search timed out</information>\n\n"
    _, text = proto.observation_tokens([], Observation(), 10_000)
    assert text == "\n\n<information></information>\n\n"


def test_final_answer_takes_the_last(proto):
    turns = ["<think> x </think><answer> Lyon </answer>", "<answer>\n Paris \n</answer>"]
    assert proto.final_answer(turns) == "Paris"
    assert proto.final_answer(["<think> x </think><search> q </search>"]) is None
    assert proto.final_answer(["<answer> unclosed"]) is None


VALID_TURNS = [
    "<think> I need the capital. </think>\n<search> capital of France </search>",
    "<think> It is Paris. </think>\n<answer> Paris </answer>",
]


def test_is_valid_format_valid(proto):
    assert proto.is_valid_format(VALID_TURNS)
    obs = ["\n\n<information>Doc 1(Title: Paris) Paris is the capital.</information>\n\n"]
    assert proto.is_valid_format(VALID_TURNS, observations=obs)
    assert proto.is_valid_format(["<think> easy </think> <answer> 4 </answer>\n"])


@pytest.mark.parametrize(
    "turns",
    [
        ["<answer> Paris </answer>"],  # no think first
        ["Sure! <think> x </think><answer> Paris </answer>"],  # text outside tags
        ["<think> x </think><answer> Paris </answer> Done."],  # text after the answer
        ["<think> x </think><search> q </search>"],  # ends after a search
        ["<think> x <search> q </search>"],  # tag inside think
        ["<think> x </think> junk", "<think> y </think><answer> Paris </answer>"],  # invalid turn
        [VALID_TURNS[0], "<search> again </search>"],  # no think after information
    ],
)
def test_is_valid_format_invalid(proto, turns):
    assert not proto.is_valid_format(turns)


def test_check_sequence_reasons():
    assert check_sequence("<think>a</think><answer>b</answer>") == (True, "valid")
    ok, reason = check_sequence("<think>a</think><search>q</search>")
    assert not ok and "after_search" in reason
    ok, reason = check_sequence("<think>a</think><information>x</information>")
    assert not ok and "<information>" in reason
