"""Tests of the FlashRAG / Search-R1 JSONL readers (round trips through the writers of
``tests/helpers/jsonl_rows.py``) and of ``data=lab_jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from searchr1.data.jsonl import (
    JsonlFormatError, LabJsonlConfig, load_corpus_jsonl, load_lab_jsonl, load_qa_jsonl,
)
from searchr1.data.types import Passage, QAExample
from tests.helpers.corpora import HOTPOTQA_MINI
from tests.helpers.jsonl_rows import write_corpus_jsonl, write_qa_jsonl


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _examples() -> list[QAExample]:
    return [
        QAExample("q0", "Who founded Drennick Labs?", ("Aldric Venhollow",), "world_1hop",
                  ("12",), ("who founded Drennick Labs",),
                  {"hops": 1, "needs_reformulation": False}),
        QAExample("q1", "Où est né Émile?", ("Tormi", "Tormi City"), "nq"),
    ]


@pytest.mark.parametrize("name", ["qa.jsonl", "qa.jsonl.gz"])
def test_questions_round_trip_with_meta(tmp_path, name):
    examples = _examples()
    write_qa_jsonl(examples, tmp_path / "sub" / name)
    loaded = load_qa_jsonl(tmp_path / "sub" / name)
    assert loaded == examples
    assert [q.meta for q in loaded] == [q.meta for q in examples]


def test_corpus_round_trip_and_title_text_rows(tmp_path):
    passages = [Passage("0", '"Tormi"\nTormi is a city.'),
                Passage("1", '"Vell"\nA river.\nSecond line.')]
    write_corpus_jsonl(passages, tmp_path / "corpus.jsonl")
    assert load_corpus_jsonl(tmp_path / "corpus.jsonl") == passages
    row = {"id": 7, "title": "Vell", "text": "A river."}
    path = _write_lines(tmp_path / "split.jsonl", [json.dumps(row)])
    (passage,) = load_corpus_jsonl(path)
    assert (passage.id, passage.title, passage.text) == ("7", "Vell", "A river.")


def test_string_gold_answer_and_extra_keys_go_to_meta(tmp_path):
    row = {"id": 3, "question": "Q?", "golden_answers": "yes", "data_source": "hotpotqa",
           "supporting_titles": ["A", "B"]}
    (example,) = load_qa_jsonl(_write_lines(tmp_path / "q.jsonl", [json.dumps(row), ""]))
    assert example.id == "3" and example.golden_answers == ("yes",)
    assert example.meta == {"supporting_titles": ["A", "B"]}


@pytest.mark.parametrize("bad_row, message", [
    ('{"id": "x", "question": "Q?", "golden_answers": ["a"]', "invalid JSON"),
    ('["not", "an", "object"]', "expected a JSON object"),
    ('{"id": "x", "question": "Q?", "data_source": "nq"}', "golden_answers"),
    ('{"id": "x", "question": "Q?", "golden_answers": {"a": 1}, "data_source": "nq"}',
     "golden_answers"),
    ('{"id": "x", "question": "", "golden_answers": ["a"], "data_source": "nq"}', "question"),
])
def test_malformed_question_row_names_file_and_line(tmp_path, bad_row, message):
    good = json.dumps({"id": "g", "question": "Q?", "golden_answers": ["a"], "data_source": "nq"})
    path = _write_lines(tmp_path / "broken.jsonl", [good, good, bad_row])
    with pytest.raises(JsonlFormatError, match=message) as info:
        load_qa_jsonl(path)
    assert "broken.jsonl:3:" in str(info.value)


def test_missing_data_source_uses_default_or_fails(tmp_path):
    row = {"id": "a", "question": "Q?", "golden_answers": ["x"]}
    path = _write_lines(tmp_path / "q.jsonl", [json.dumps(row)])
    with pytest.raises(JsonlFormatError, match="q.jsonl:1: missing key.*data_source"):
        load_qa_jsonl(path)
    assert load_qa_jsonl(path, default_source="lab")[0].data_source == "lab"


def test_malformed_corpus_row_names_the_line(tmp_path):
    lines = ['{"id": "0", "contents": "\\"T\\"\\nx"}', '{"id": "1"}']
    path = _write_lines(tmp_path / "c.jsonl", lines)
    with pytest.raises(JsonlFormatError, match="c.jsonl:2: needs a string 'contents'"):
        load_corpus_jsonl(path)


def test_lab_jsonl_config_loads_splits_and_optional_parts(tmp_path):
    examples = _examples()
    write_qa_jsonl(examples, tmp_path / "train.jsonl")
    write_qa_jsonl(examples[:1], tmp_path / "dev.jsonl")
    write_corpus_jsonl([Passage("0", '"T"\nx')], tmp_path / "corpus.jsonl")
    cfg = LabJsonlConfig(train_path=str(tmp_path / "train.jsonl"),
                         dev_path=str(tmp_path / "dev.jsonl"))
    ds = load_lab_jsonl(cfg)
    assert (ds.train, ds.dev, ds.test, ds.corpus) == (examples, examples[:1], [], None)
    cfg.test_path, cfg.corpus_path = cfg.dev_path, str(tmp_path / "corpus.jsonl")
    ds = load_lab_jsonl(cfg)
    assert ds.test == examples[:1] and [p.id for p in ds.corpus] == ["0"]


def test_lab_jsonl_schema_requires_the_train_and_dev_paths():
    cfg = OmegaConf.structured(LabJsonlConfig)
    assert cfg.name == "lab_jsonl" and cfg.test_path is None and cfg.corpus_path is None
    with pytest.raises(MissingMandatoryValue):
        _ = cfg.train_path


def test_loads_the_shared_hotpotqa_mini_sample():
    if not (HOTPOTQA_MINI / "questions.jsonl").exists():
        pytest.skip(f"{HOTPOTQA_MINI} is not present")
    questions = load_qa_jsonl(HOTPOTQA_MINI / "questions.jsonl")
    corpus = load_corpus_jsonl(HOTPOTQA_MINI / "corpus.jsonl")
    assert (len(questions), len(corpus)) == (100, 994)
    assert {q.data_source for q in questions} == {"hotpotqa"}
    assert all(q.golden_answers and q.question.strip() for q in questions)
    titles = {p.title for p in corpus}
    assert len(titles) == 994 and all(t and not t.startswith('"') for t in titles)
    assert all(p.text.strip() for p in corpus)
    assert all(set(q.meta["supporting_titles"]) <= titles for q in questions)


ROOT = Path(__file__).resolve().parents[2]
ROW = '{"id": "%s", "question": "Who built %s?", "golden_answers": ["x"], "data_source": "nq"}\n'


def _windows_export(path: Path) -> int:
    """Two rows, the second with a cp1252 'é' (0xe9): returns the bad byte's file offset."""
    first = b"\xef\xbb\xbf" + (ROW % ("a", "Tormi")).encode()  # a BOM too, as Windows writes
    second = (ROW % ("b", "Caf\xe9")).encode("cp1252")
    path.write_bytes(first + second)
    return len(first) + second.index(b"\xe9")


@pytest.mark.parametrize("name", ["q.jsonl", "q.jsonl.gz"])
def test_a_byte_that_is_not_utf8_names_file_line_and_offset(tmp_path, name):
    import gzip

    plain = tmp_path / "plain.jsonl"
    offset = _windows_export(plain)
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(plain.read_bytes()))
    else:
        plain.rename(path)
    with pytest.raises(JsonlFormatError) as info:
        load_qa_jsonl(path)
    assert str(info.value).startswith(f"{path}:2: byte {offset} of the file (0xe9, column ")
    assert "not UTF-8" in str(info.value)
    fine = tmp_path / "fine.jsonl"
    fine.write_bytes(b"\xef\xbb\xbf" + (ROW % ("a", "T")).encode())  # a BOM alone is fine
    assert [q.id for q in load_qa_jsonl(fine)] == ["a"]


def test_main_refuses_a_data_file_that_is_not_utf8_with_exit_2(tmp_path):
    import subprocess
    import sys

    data = tmp_path / "train.jsonl"
    offset = _windows_export(data)
    cmd = [sys.executable, "-m", "searchr1.main", f"hydra.run.dir={tmp_path / 'run'}",
           "data=lab_jsonl", f"data.train_path={data}", f"data.dev_path={data}",
           "retriever=http", f"engine.cache_dir={tmp_path / 'model_cache'}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"{data}:2: byte {offset} of the file (0xe9" in out.stderr
    assert "Traceback" not in out.stderr and "UnicodeDecodeError" not in out.stderr
    assert not (tmp_path / "model_cache").exists()  # refused before the model loads
