"""protocol=tool_call on the real Qwen3.5 and Qwen2.5 chat templates, offline.

The templates are fixtures (tests/fixtures/chat_templates/, provenance in its README). The
tokenizer around them is a small byte-level BPE trained here, with the chat markers added as
special tokens, wrapped in ``PreTrainedTokenizerFast`` — the same ``apply_chat_template``
path a hub tokenizer takes, without the hub.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from searchr1.protocols.base import PROTOCOLS, ActionKind, Observation
from searchr1.protocols.tool_call import (
    SEARCH_TOOL,
    TemplateError,
    ToolCallConfig,
    ToolCallProtocol,
    format_documents,
)
from searchr1.retrievers.base import Document

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"
SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
    "<think>", "</think>", "<tool_response>", "</tool_response>",
]
CORPUS = [
    "The Eiffel Tower is 330 metres tall and stands in Paris, the capital of France.",
    "Search for the answer, then give a short answer. Title Content Source URL query",
    '{"name": "search", "arguments": {"query": "height of the Eiffel Tower"}}',
]


def make_tokenizer(template: str) -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE (trained on the template itself and a few lines) + template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([template, *CORPUS] * 3, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, chat_template=template,
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )


TEMPLATES = ["qwen3_5_4b", "qwen2_5_7b_instruct", "smollm2_135m_instruct"]


@pytest.fixture(scope="module", params=TEMPLATES)
def tok(request) -> PreTrainedTokenizerFast:
    return make_tokenizer((FIXTURES / f"{request.param}.jinja").read_text())


@pytest.fixture(scope="module")
def qwen35() -> ToolCallProtocol:
    return ToolCallProtocol(make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text()))


def xml_call(query: str, name: str = "search", extra: str = "") -> str:
    params = f"<parameter=query>\n{query}\n</parameter>\n{extra}"
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def json_call(query: str) -> str:
    return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'


def docs(*titles: str, chars: int = 80) -> tuple[Document, ...]:
    return tuple(
        Document(f"id{i}", t, (f"{t} is a fact. " * 200)[:chars], url=f"https://zhihu.com/{i}",
                 source="zhihu/answer / Alice")
        for i, t in enumerate(titles)
    )


def ids(out) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# ---- parsing ------------------------------------------------------------------------------

SEARCH, ANSWER, INVALID = ActionKind.SEARCH, ActionKind.ANSWER, ActionKind.INVALID
PARSE_CASES = [
    ("Let me look it up.\n\n" + xml_call("Eiffel Tower height"), SEARCH, "Eiffel Tower height"),
    (xml_call("Eiffel Tower height") + "<|im_end|>", SEARCH, "Eiffel Tower height"),
    (json_call("capital of France"), SEARCH, "capital of France"),
    (r'<tool_call>{"name": "search", "arguments": "{\"query\": \"x\"}"}</tool_call>', SEARCH, "x"),
    ("<think>\n" + xml_call("draft") + "\n</think>\n\nAnswer: Paris", ANSWER, "Paris"),
    ("The tower is tall.\nAnswer: 330 metres<|im_end|>", ANSWER, "330 metres"),
    ("Answer: Lyon\nOn reflection:\nAnswer: Paris", ANSWER, "Paris"),
    ("**Answer:** Paris", ANSWER, "Paris"),
    (xml_call("x").replace("</parameter>\n", ""), INVALID, "malformed"),
    (xml_call("x").removesuffix("\n</tool_call>"), INVALID, "unbalanced"),
    ('<tool_call>{"name": "search", "arguments": {"query": }}</tool_call>', INVALID, "JSON"),
    (xml_call("a") + "\n" + xml_call("b"), INVALID, "2 tool calls"),
    (json_call("a") + json_call("b"), INVALID, "2 tool calls"),
    (xml_call("   "), INVALID, "empty"),
    (json_call(""), INVALID, "empty"),
    ("Answer: Paris\n" + xml_call("check"), INVALID, "same turn"),
    (xml_call("check") + "\nAnswer: Paris", INVALID, "same turn"),
    (xml_call("check") + "\nLet me wait.", INVALID, "after the tool call"),
    (xml_call("x", name="lookup"), INVALID, "unknown tool"),
    (xml_call("x", extra="<parameter=k>\n3\n</parameter>\n"), INVALID, "exactly one"),
    (xml_call("x")[len("<tool_call>\n") : -len("\n</tool_call>")], INVALID, "outside"),
    ("I think it is Paris.", INVALID, "neither"),
    ("Answer:   ", INVALID, "neither"),
]


@pytest.mark.parametrize(("text", "kind", "detail"), PARSE_CASES)
def test_parse_action(qwen35: ToolCallProtocol, text: str, kind: ActionKind, detail: str):
    action = qwen35.parse_action(text)
    assert action.kind is kind, action
    if kind is SEARCH:
        assert action.query == detail
    elif kind is ANSWER:
        assert action.answer == detail
    else:
        assert detail in action.error


def test_final_answer_and_format(qwen35: ToolCallProtocol):
    good = [xml_call("a"), json_call("b"), "So:\nAnswer: Paris<|im_end|>"]
    assert qwen35.final_answer(good) == "Paris" and qwen35.is_valid_format(good)
    assert qwen35.is_valid_format(["Answer: Paris"])
    assert not qwen35.is_valid_format([xml_call("a"), xml_call("b")])  # never answered
    assert not qwen35.is_valid_format(["I guess", "Answer: Paris"])  # an invalid turn
    mixed = [xml_call("a"), xml_call("b") + "\nAnswer: Paris"]
    assert qwen35.final_answer(mixed) == "Paris" and not qwen35.is_valid_format(mixed)
    assert qwen35.final_answer([xml_call("a")]) is None


# ---- prompts and token continuity -----------------------------------------------------------


def render(tok, proto: ToolCallProtocol, conv: list[dict], tokenize: bool):
    return tok.apply_chat_template(
        conv, tools=[SEARCH_TOOL], chat_template=proto.chat_template,
        add_generation_prompt=True, tokenize=tokenize, enable_thinking=False,
    )


def test_initial_prompt_is_the_template_rendering(tok):
    proto = ToolCallProtocol(tok, system_prompt="You are careful.")
    prompt = proto.initial_prompt("How tall is the Eiffel Tower?")
    assert prompt == ids(render(tok, proto, proto.messages("How tall is the Eiffel Tower?"), True))
    text = tok.decode(prompt)
    assert SEARCH_TOOL["function"]["description"] in text and "Answer: <short answer>" in text
    assert proto.stop == [tok.convert_tokens_to_ids("<|im_end|>")]
    if "enable_thinking" in proto.chat_template:  # Qwen3.5
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_token_continuity_over_three_turns(tok):
    """Each next prompt = previous prompt + sampled + observation tokens, and those
    observation tokens are exactly the tail of the template's rendering of the dialogue."""
    proto = ToolCallProtocol(tok, system_prompt="You are careful.")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    conv = proto.messages("How tall is the Eiffel Tower?")
    prompt = proto.initial_prompt("How tall is the Eiffel Tower?")
    turns = [
        ("Let me search.\n\n" + xml_call("Eiffel Tower height"), True, docs("Tower", "Paris")),
        (json_call("Eiffel Tower metres"), False, docs("Tower facts")),  # cut before <|im_end|>
        ("It is 330 metres tall.\nAnswer: 330 metres", True, None),
    ]
    for text, ends_with_stop, results in turns:
        sampled = tok.encode(text, add_special_tokens=False) + ([im_end] if ends_with_stop else [])
        action = proto.parse_action(tok.decode(sampled))
        conv.append({"role": "assistant", "content": text})
        if results is None:
            assert action.kind is ActionKind.ANSWER and action.answer == "330 metres"
            break
        assert action.kind is ActionKind.SEARCH
        obs, obs_text = proto.observation_tokens(sampled, Observation(documents=results), 2000)
        content = format_documents(list(results), 1200)
        assert content in obs_text
        conv.append({"role": "tool", "name": "search", "content": content})
        assert obs[0] != im_end if ends_with_stop else obs[0] == im_end
        full_tokens = ids(render(tok, proto, conv, True))
        assert full_tokens[-len(obs) :] == obs
        next_prompt = prompt + sampled + obs
        assert next_prompt[: len(prompt)] == prompt
        assert tok.decode(next_prompt) == render(tok, proto, conv, False)
        prompt = next_prompt


def test_continuity_with_thinking_enabled():
    """Qwen3.5 with enable_thinking=True: the prompt opens <think>, the model closes it."""
    tok = make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text())
    proto = ToolCallProtocol(tok, enable_thinking=True)
    prompt = proto.initial_prompt("Q?")
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    text = "I need evidence.\n</think>\n\n" + xml_call("q")
    sampled = tok.encode(text, add_special_tokens=False) + proto.stop
    assert proto.parse_action(tok.decode(sampled)).query == "q"
    obs, _ = proto.observation_tokens(sampled, Observation(documents=docs("A")), 1000)
    conv = proto.messages("Q?") + [
        {"role": "assistant", "content": text},
        {"role": "tool", "content": format_documents(list(docs("A")), 1200)},
    ]
    full = tok.apply_chat_template(
        conv, tools=[SEARCH_TOOL], add_generation_prompt=True, tokenize=False, enable_thinking=True
    )
    assert tok.decode(prompt + sampled + obs) == full


# ---- observation content and budget ---------------------------------------------------------


def test_observation_lists_title_content_source_url(qwen35: ToolCallProtocol):
    _, text = qwen35.observation_tokens([], Observation(documents=docs("Paris", chars=3000)), 5000)
    assert "[1] Title: Paris\nContent: " in text
    assert "Source: zhihu/answer / Alice\nURL: https://zhihu.com/0" in text
    content = text.split("Content: ", 1)[1].split("\nSource:", 1)[0]
    assert len(content) == 1200


def test_observation_drops_whole_documents_last_first(qwen35: ToolCallProtocol):
    three = docs("Alpha", "Bravo", "Charlie", chars=400)
    two_tokens, _ = qwen35.observation_tokens([], Observation(documents=three[:2]), 10_000)
    tokens, text = qwen35.observation_tokens([], Observation(documents=three), len(two_tokens))
    assert tokens == two_tokens and "Bravo" in text and "Charlie" not in text


def test_single_document_is_cut_to_fit(qwen35: ToolCallProtocol):
    empty, _ = qwen35.observation_tokens([], Observation(documents=()), 10_000)
    budget = len(empty) + 60
    long_doc = Observation(documents=docs("Alpha", chars=900))
    tokens, text = qwen35.observation_tokens([], long_doc, budget)
    assert len(tokens) <= budget and "Title: Alpha" in text
    assert 0 < len(text.split("Content: ", 1)[1].split("\nSource:", 1)[0]) < 900


def test_invalid_and_error_observations(qwen35: ToolCallProtocol):
    _, invalid = qwen35.observation_tokens([], Observation(invalid=True), 1000)
    assert "Answer: <short answer>" in invalid and "<tool_response>" in invalid
    error = Observation(error="search failed, please try again")
    _, failed = qwen35.observation_tokens([], error, 1000)
    assert "search failed, please try again" in failed
    _, none = qwen35.observation_tokens([], Observation(documents=()), 1000)
    assert "No results found." in none


# ---- templates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fallback"),
    [("qwen3_5_4b", False), ("qwen2_5_7b_instruct", False), ("smollm2_135m_instruct", True)],
)
def test_fallback_only_for_templates_without_tools(name: str, fallback: bool):
    tok = make_tokenizer((FIXTURES / f"{name}.jinja").read_text())
    assert ToolCallProtocol(tok).uses_fallback is fallback


def test_fallback_template_renders_the_tool():
    tok = make_tokenizer((FIXTURES / "smollm2_135m_instruct.jinja").read_text())
    proto = ToolCallProtocol(tok)
    text = tok.decode(proto.initial_prompt("Q?"))
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "search"' in text
    assert "SmolLM" not in text  # the fallback injects no model-specific system prompt


def test_non_prefix_stable_template_is_rejected():
    counting = (
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="prefix-stable"):
        ToolCallProtocol(make_tokenizer(counting))


def test_config_and_registry():
    assert PROTOCOLS.get("tool_call") is ToolCallProtocol
    tok = make_tokenizer((FIXTURES / "qwen2_5_7b_instruct.jinja").read_text())
    cfg = ToolCallConfig(system_prompt="Be brief.")
    proto = ToolCallProtocol.from_config(cfg, tok)
    assert "Be brief." in tok.decode(proto.initial_prompt("Q?"))
