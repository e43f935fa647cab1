"""Duplicate question ids and over-long questions are warned about once, with counts per split;
a UTF-8 byte-order mark is accepted by the loader and by the start-up check."""

from __future__ import annotations

import logging

from searchr1.data.audit import data_warnings, duplicate_ids, overlong, warn_data_quirks
from searchr1.data.jsonl import load_corpus_jsonl, load_qa_jsonl
from searchr1.data.types import Dataset, QAExample
from searchr1.retrievers.bm25 import read_corpus_jsonl
from searchr1.rollout.config import RolloutConfig
from searchr1.startup.checks import _file_problem
from tests.conftest import tiny_tokenizer


def _q(qid: str, text: str) -> QAExample:
    return QAExample(id=qid, question=text, golden_answers=("a",), data_source="t")


def test_duplicates_count_every_repeat_after_the_first():
    rows = [_q("a", "x"), _q("b", "x"), _q("a", "y"), _q("c", "z"), _q("a", "w"), _q("c", "v")]
    assert duplicate_ids(rows) == (3, "a")
    assert duplicate_ids(rows[:2]) == (0, None)


def test_over_long_is_exact_at_the_limit_with_a_char_tokenizer():
    tok = tiny_tokenizer()  # one token per ASCII character
    rows = [_q("fits", "x" * 10), _q("over", "y" * 11), _q("far", "z" * 40), _q("tiny", "q")]
    assert overlong(rows, tok, 10) == (2, "over")
    assert overlong(rows, tok, 40) == (0, None)


def test_one_warning_with_counts_per_split_naming_the_limit(caplog):
    ds = Dataset(train=[_q("1", "a" * 70), _q("1", "b"), _q("2", "c")],
                 dev=[_q("d", "e"), _q("d", "f" * 65)], test=[])
    caplog.set_level(logging.WARNING, logger="searchr1.data.audit")
    found = warn_data_quirks(ds, tiny_tokenizer(), RolloutConfig(max_trajectory_tokens=2048,
                                                                 max_prompt_tokens=64))
    assert found == [
        "2 rows repeat an earlier question id of their split (train 1, dev 1; first id '1')",
        "2 questions are longer than the context (rollout.max_prompt_tokens=64 tokens), so the "
        "sampler sees only their tail (train 1, dev 1; first id '1')"]
    assert len(caplog.records) == 1 and "; ".join(found) in caplog.records[0].getMessage()
    clean = Dataset(train=[_q("1", "a")], dev=[_q("2", "b")], test=[])
    assert data_warnings(clean, tiny_tokenizer(), 2048, "rollout.max_trajectory_tokens") == []


def test_a_byte_order_mark_is_accepted_by_loaders_and_the_start_up_check(tmp_path):
    qa = tmp_path / "q.jsonl"
    qa.write_bytes(b"\xef\xbb\xbf" + '{"id": "1", "question": "q?", "golden_answers": ["a"], '
                   '"data_source": "nq"}\n'.encode())
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b"\xef\xbb\xbf" + b'{"id": "7", "contents": "\\"T\\"\\ntext"}\n')
    assert _file_problem("data.train_path", str(qa)) is None
    assert [e.id for e in load_qa_jsonl(qa)] == ["1"]
    assert [p.id for p in load_corpus_jsonl(corpus)] == ["7"]
    assert [p.id for p in read_corpus_jsonl(corpus)] == ["7"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xef\xbb\xbfid,question\n")
    assert "the first row is not JSON" in _file_problem("data.train_path", str(bad))
