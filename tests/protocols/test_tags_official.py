"""The paper's protocol, exactly: cut rule + EOS, quoted titles, token truncation, ``?``,
the dataset prompt, and left-truncation of the running context in the rollout engine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from searchr1.data.nq_hotpotqa import NqHotpotqaConfig, load_nq_hotpotqa, read_examples
from searchr1.data.types import QAExample
from searchr1.protocols.base import Observation
from searchr1.protocols.tags import (
    INVALID_ACTION_MESSAGE,
    CutRule,
    ObservationTruncation,
    PromptSource,
    TagsProtocol,
    format_passage,
    with_question_mark,
)
from searchr1.protocols.tags_cut import cut_sampled_turn, official_cut_text
from searchr1.retrievers.base import Document
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.config import RolloutConfig
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever, dec, enc
from tests.data.test_nq_hotpotqa import SOURCES, row, write

EOS = "<eos>"


class PieceTokenizer:
    """Tokens are given as strings by the test: id = index in a vocabulary grown on use."""

    chat_template = None

    def __init__(self) -> None:
        self.vocab = [EOS]
        self.all_special_ids = [0]

    def ids(self, pieces: list[str]) -> list[int]:
        for p in pieces:
            if p not in self.vocab:
                self.vocab.append(p)
        return [self.vocab.index(p) for p in pieces]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.ids(list(text))  # char pieces for prompts and observations

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.vocab[i] for i in ids
                       if not (skip_special_tokens and i in self.all_special_ids))


@pytest.fixture()
def pieces() -> PieceTokenizer:
    return PieceTokenizer()


def cut(tok: PieceTokenizer, parts: list[str]):
    ids = tok.ids(parts)
    logprobs = [-(k + 1) / 10 for k in range(len(ids))]
    return ids, cut_sampled_turn(ids, logprobs, lambda t: tok.decode(t, True),
                                 tok.all_special_ids)


# ---------------------------------------------------------------------------- cut rule


def test_search_anywhere_wins_over_an_earlier_answer():
    text = "<answer> Paris </answer><think> no </think><search> capital </search> tail"
    assert official_cut_text(text) == (
        "<answer> Paris </answer><think> no </think><search> capital </search>", "</search>")
    assert official_cut_text("<answer> x </answer> more </answer>") == (
        "<answer> x </answer>", "</answer>")
    assert official_cut_text("no tag at all") == ("no tag at all", None)


def test_cut_keeps_the_sampled_prefix_and_its_logprobs(pieces):
    parts = ["<think>", " a ", "</think>", "<answer>", " Paris ", "</answer>", "<think>",
             "</think>", "<search>", " q ", "</search>", "<information>", " junk", EOS]
    ids, kept = cut(pieces, parts)
    assert kept.tokens == ids[:11]  # through </search>, never re-tokenised
    assert kept.logprobs == [-(k + 1) / 10 for k in range(11)]
    assert kept.text == "".join(parts[:11])


def test_tag_ending_inside_a_token_keeps_that_token(pieces):
    parts = ["<search>", " q ", "</sea", "rch", ">\n\n", "<inf", "ormation>"]
    ids, kept = cut(pieces, parts)
    assert kept.tokens == ids[:5]  # ">\n\n" closes the tag: kept whole
    assert kept.text == "<search> q </search>"  # the official string, cut at the tag
    assert pieces.decode(kept.tokens) == kept.text + "\n\n"


def test_eos_is_dropped_with_or_without_a_tag(pieces):
    ids, kept = cut(pieces, ["<think>", " hm", EOS])
    assert kept.tokens == ids[:2] and kept.text == "<think> hm"
    ids, kept = cut(pieces, ["<answer>", " x ", "</answer>", EOS])
    assert kept.tokens == ids[:3] and kept.text == "<answer> x </answer>"
    ids, kept = cut(pieces, ["<think>", " long"])  # hit the length limit: kept whole
    assert kept.tokens == ids


def test_mismatched_logprobs_are_an_error(pieces):
    with pytest.raises(ValueError, match="2 sampled tokens but 1 logprobs"):
        cut_sampled_turn([1, 2], [0.0], lambda t: "", ())


def test_cut_turn_per_rule(pieces):
    official = TagsProtocol(pieces, cut="official")
    first = TagsProtocol(pieces)
    assert official.stop == [] and first.stop == ["</search>", "</answer>"]
    ids = pieces.ids(["<answer>", " x ", "</answer>", EOS])
    lps = [-0.1, -0.2, -0.3, -0.4]
    assert official.cut_turn(ids, lps, "ignored", "stop") == (
        ids[:3], lps[:3], "<answer> x </answer>")
    assert first.cut_turn(ids, lps, "<answer> x </answer>", "stop") == (
        ids, lps, "<answer> x </answer>")  # first_stop keeps the EOS


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained so that ``>\\n\\n`` and ``</search>`` merge (no network)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["<search> capital of France </search>\n\n<information>"] * 50,
                            trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)


def test_official_cut_on_a_real_bpe_keeps_token_continuity(bpe):
    proto = TagsProtocol(bpe, cut="official", use_chat_template=False)
    sampled = bpe.encode("<think> x </think><answer> Paris </answer><search> capital of "
                         "France </search>\n\n<information> made up", add_special_tokens=False)
    sampled += [bpe.eos_token_id]
    tokens, logprobs, text = proto.cut_turn(sampled, [-1.0] * len(sampled), "", "stop")
    assert tokens == sampled[: len(tokens)]
    assert text.endswith("France </search>") and "<information>" not in text
    assert bpe.decode(tokens).startswith(text)
    assert "</search>" not in bpe.decode(tokens[:-1])  # the shortest such prefix
    assert len(logprobs) == len(tokens)


# ------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class RawDoc(Document):
    """A document that also carries the corpus ``contents`` (the official title source)."""

    contents: str = ""


def test_quoted_titles_stay_verbatim():
    doc = RawDoc("1", "Hamlet", "A play.\nBy Shakespeare.",
                 contents='"Hamlet"\nA play.\nBy Shakespeare.')
    assert format_passage(1, doc) == 'Doc 1(Title: "Hamlet") A play.\nBy Shakespeare.\n'
    assert format_passage(2, Document("2", "Lyon", "City.")) == "Doc 2(Title: Lyon) City.\n"


def test_token_truncation_keeps_the_first_n_tokens(pieces):
    proto = TagsProtocol(pieces, observation_truncation="tokens")
    docs = (Document("1", "Paris", "Paris is the capital of France."),)
    full = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
    tokens, text = proto.observation_tokens([], Observation(documents=docs), 30)
    assert tokens == pieces.encode(full)[:30] and text == full[:30]
    assert "</information>" not in text  # lost, as officially
    tokens, text = proto.observation_tokens([], Observation(documents=docs), 500)
    assert text == full and len(tokens) == len(full)
    _, text = proto.observation_tokens([], Observation(invalid=True), 10)
    assert text == INVALID_ACTION_MESSAGE[:10]  # every observation is cut alike


def test_passage_truncation_still_drops_whole_passages(pieces):
    proto = TagsProtocol(pieces)
    docs = (Document("1", "A", "x" * 10), Document("2", "B", "y" * 10))
    _, text = proto.observation_tokens([], Observation(documents=docs), 60)
    assert text == "\n\n<information>Doc 1(Title: A) xxxxxxxxxx</information>\n\n"


# ------------------------------------------------------------------------------ prompts


@pytest.mark.parametrize("question, expected", [
    ("Who wrote Hamlet", "Who wrote Hamlet?"), ("  Who wrote Hamlet?  ", "Who wrote Hamlet?"),
    ("capital of France.", "capital of France.?"),
])
def test_question_mark_is_appended_as_officially(question, expected, pieces):
    assert with_question_mark(question) == expected
    text = TagsProtocol(pieces).prompt_text(question)
    assert text.endswith(f"Question: {expected}\n")


@pytest.fixture()
def official_parquet(tmp_path):
    """test.parquet + train.parquet in the official schema; prompts marked per row."""
    test = [row(7 * k + j, s, "test") for k, s in enumerate(SOURCES) for j in range(3)]
    write(tmp_path / "test.parquet", test)
    write(tmp_path / "train.parquet", [row(i, "nq", "train") for i in range(4)])
    return tmp_path


def test_dataset_prompt_is_the_rows_rendered_prompt(official_parquet, bpe):
    (ex, *_) = read_examples(official_parquet / "test.parquet")
    content = f"Answer the given question. Question: {ex.question}"
    assert ex.meta["prompt"] == [{"role": "user", "content": content}]
    raw = TagsProtocol(bpe, prompt="dataset", use_chat_template=False)
    assert raw.example_prompt_text(ex) == content
    assert bpe.decode(raw.example_prompt(ex)) == content
    bpe.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    templated = TagsProtocol(bpe, prompt="dataset")
    assert templated.example_prompt_text(ex) == f"<|user|>{content}"
    with pytest.raises(ValueError, match="example_prompt"):
        templated.initial_prompt(ex.question)


def test_dataset_prompt_without_the_column_is_a_clear_error(pieces):
    ex = QAExample(id="w1", question="q?", golden_answers=("a",), data_source="world_1hop")
    with pytest.raises(ValueError, match="'prompt' column.*'w1'"):
        TagsProtocol(pieces, prompt="dataset").example_prompt(ex)


def test_paper_eval_test_split_can_be_the_whole_file(official_parquet):
    base = dict(source="local", local_dir=str(official_parquet))
    split = load_nq_hotpotqa(NqHotpotqaConfig(**base, dev_per_source=1))
    whole = load_nq_hotpotqa(NqHotpotqaConfig(**base, dev_per_source=0))
    assert (len(split.dev), len(split.test), len(whole.dev), len(whole.test)) == (7, 14, 0, 21)
    assert {e.data_source for e in whole.test} == set(SOURCES)
    assert all("prompt" in e.meta for e in whole.test)  # every row carries its prompt


def test_paper_options_compose_and_build(bpe):
    from tests.test_config import _compose

    cfg = _compose(["protocol.cut=official", "protocol.observation_truncation=tokens",
                    "protocol.prompt=dataset", "rollout.max_prompt_tokens=4096"])
    assert cfg.rollout.max_prompt_tokens == 4096
    proto = TagsProtocol.from_config(OmegaConf.to_object(cfg.protocol), bpe)
    assert (proto.cut, proto.observation_truncation, proto.prompt) == (
        CutRule.official, ObservationTruncation.tokens, PromptSource.dataset)
    assert proto.stop == []
    with pytest.raises(ConfigCompositionException):
        _compose(["protocol.cut=first_tag"])


# ------------------------------------------------------------- context left-truncation

EX = QAExample(id="q1", question="who", golden_answers=("x",), data_source="t")


def test_running_context_is_left_truncated_and_cut_turns_are_not_trained():
    # prompt "Q:who|" (6) + "S:ab;" (5) + "[d-ab]" (6) = 17 > 12: turn 2 sees the last 12
    script = lambda prompt, i: "S:ab;" if "[" not in prompt else "A:x;"
    sampler = ScriptedSampler(script)
    cfg = RolloutConfig(max_prompt_tokens=12)
    eng = RolloutEngine(CharProtocol(), SlowRetriever(0.0), topk=1, cfg=cfg)
    (traj,) = asyncio.run(eng.rollout_group(sampler, EX, 1, SamplingSettings(0.0)))
    full = "Q:who|S:ab;[d-ab]"
    assert [c for c, _ in sampler.calls] == ["Q:who|", full[-12:]]
    assert dec(traj.tokens_T) == full + "A:x;"  # the trajectory keeps every token
    assert traj.mask_T == [0] * 6 + [1] * 5 + [0] * 6 + [0] * 4  # turn 2: context only
    assert traj.logprobs_T[-4:] == [0.0] * 4
    assert traj.turns[1].sampled_logprobs == [-0.1, -0.2, -0.3, -0.4]  # still recorded
    assert traj.turns[1].action.answer == "x"


def test_a_long_first_prompt_is_itself_left_truncated():
    sampler = ScriptedSampler(lambda prompt, i: "A:x;")
    cfg = RolloutConfig(max_prompt_tokens=4)
    eng = RolloutEngine(CharProtocol(), SlowRetriever(0.0), topk=1, cfg=cfg)
    (traj,) = asyncio.run(eng.rollout_group(sampler, EX, 1, SamplingSettings(0.0)))
    assert sampler.calls[0][0] == "who|"
    assert traj.tokens_T[: traj.prompt_len] == enc("who|")
    assert traj.mask_T == [0] * 4 + [1] * 4  # sampled on exactly this context: trained


def test_engine_applies_the_official_cut():
    """A tags protocol with cut=official on a sampler that runs past the tag to EOS."""
    reply = "<answer> x </answer><think> more"
    sampler = ScriptedSampler(lambda prompt, i: reply)
    proto = TagsProtocol(CharTok(), cut="official", use_chat_template=False)
    eng = RolloutEngine(proto, SlowRetriever(0.0), topk=1, cfg=RolloutConfig())
    (traj,) = asyncio.run(eng.rollout_group(sampler, EX, 1, SamplingSettings(0.0)))
    assert traj.turns[0].text == "<answer> x </answer>"
    assert dec(traj.tokens_T[traj.prompt_len:]) == "<answer> x </answer>"
    assert sum(traj.mask_T) == len("<answer> x </answer>")


class CharTok:
    """Code points as ids, matching ``rollout_fakes.enc``/``dec``."""

    chat_template = None
    all_special_ids: list[int] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return enc(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return dec(ids)


# ------------------------------------------------------------- the empty query

def test_an_empty_search_is_a_search_for_the_empty_string_under_empty_query_search():
    """Official (generation.py postprocess_predictions / execute_predictions): the first
    ``<(search|answer)>(.*?)</\\1>`` match with content "" is a search; "" goes to the
    retriever, its result fills the information block, the turn is valid, and a later
    correct answer in a valid sequence scores 1.0 (qa_em_format). Ours by default: an
    invalid turn, the retry message, an invalid sequence, 1 − 0.2 = 0.8."""
    from searchr1.protocols.tags import EmptyQuery
    from searchr1.rewards import RewardConfig, build_reward
    from searchr1.rollout.scoring import score_trajectory

    turns = ["<think> a </think><search></search>", "<think> b </think><answer> x </answer>"]
    script = lambda prompt, i: turns[1] if "Doc 1" in prompt or "invalid" in prompt else turns[0]  # noqa: E731
    reward = build_reward(RewardConfig(name="em_format_paper"))
    got = {}
    for rule in EmptyQuery:
        proto = TagsProtocol(CharTok(), cut="official", use_chat_template=False, empty_query=rule)
        retriever = SlowRetriever(0.0)
        eng = RolloutEngine(proto, retriever, topk=1, cfg=RolloutConfig())
        (traj,) = asyncio.run(eng.rollout_group(ScriptedSampler(script), EX, 1, SamplingSettings(0.0)))
        score_trajectory(traj, proto, reward)
        got[rule] = (traj.num_searches, traj.turns[0].observation_text, traj.scores["format"],
                     traj.reward, retriever.metrics()["search/requests"])
    assert got[EmptyQuery.search] == (
        1, "\n\n<information>Doc 1(Title: ) about</information>\n\n", 1.0, 1.0, 1.0)
    assert got[EmptyQuery.invalid] == (0, INVALID_ACTION_MESSAGE, 0.0, pytest.approx(0.8), 0.0)
    assert TagsProtocol(CharTok()).empty_query is EmptyQuery.invalid  # ours stays the default
