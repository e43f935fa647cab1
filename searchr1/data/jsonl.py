"""FlashRAG / Search-R1 JSONL files: question rows, corpus rows, and ``data=lab_jsonl``.

Question rows are ``{"id", "question", "golden_answers", "data_source", ...}``; any other key
(``supporting_titles``, a generated world's ``hops`` …) is kept in ``QAExample.meta``. Corpus
rows are ``{"id", "contents": "\\"Title\\"\\ntext"}``; rows split into ``title`` and ``text``
are accepted too. A malformed row, or a byte that is not UTF-8, raises ``JsonlFormatError`` naming
the file and line (and the byte's offset), because a silent skip would quietly shrink a
benchmark; ``build.py`` turns it into the one-paragraph exit 2 of start-up problems.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING

from searchr1.data.types import Dataset, Passage, QAExample

# Keys that map onto QAExample fields; every other key of a question row goes to ``meta``.
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, dropped from a first line
QA_FIELDS = ("id", "question", "golden_answers", "data_source", "supporting_ids", "oracle_queries")


class JsonlFormatError(ValueError):
    """A JSONL row that cannot be read; the message starts with ``path:line``."""


def _decode(raw: bytes, where: str, offset: int) -> str:
    """One line's bytes as text; a byte that is not UTF-8 raises naming it and its offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = raw[err.start]
        raise JsonlFormatError(
            f"{where}: byte {offset + err.start} of the file (0x{bad:02x}, column "
            f"{err.start + 1} of the line) is not UTF-8; save the file as UTF-8 (files exported "
            f"on Windows are often cp1252 or latin-1: iconv -f cp1252 -t utf-8)") from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield ``("file:line", row)`` per non-blank line; a line that is not an object, or
    holds a byte that is not UTF-8, raises naming the file, line (and byte offset)."""
    path = Path(path).expanduser()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        offset = 0  # of the line's first byte (in the decompressed stream of a .gz)
        for lineno, raw in enumerate(handle, start=1):
            where = f"{path}:{lineno}"
            start = len(BOM) if lineno == 1 and raw.startswith(BOM) else 0  # editors on Windows
            line = _decode(raw[start:], where, offset + start)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise JsonlFormatError(f"{where}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise JsonlFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def _strings(value: object, key: str, where: str) -> tuple[str, ...]:
    """A string or a list of strings/numbers as a tuple of strings."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return tuple(str(v) for v in value)
    raise JsonlFormatError(f"{where}: {key!r} must be a string or a list of strings")


def qa_from_row(row: dict, where: str, default_source: str | None = None) -> QAExample:
    """One question row as a ``QAExample``; ``where`` ("file:line") prefixes any error."""
    missing = [key for key in ("id", "question", "golden_answers") if key not in row]
    source = row.get("data_source", default_source)
    if source is None:
        missing.append("data_source")
    if missing:
        raise JsonlFormatError(f"{where}: missing key(s) {', '.join(missing)}")
    if not isinstance(row["question"], str) or not row["question"].strip():
        raise JsonlFormatError(f"{where}: 'question' must be a non-empty string")
    answers = _strings(row["golden_answers"], "golden_answers", where)
    if not answers:
        raise JsonlFormatError(f"{where}: 'golden_answers' is empty")
    return QAExample(
        id=str(row["id"]), question=row["question"], golden_answers=answers,
        data_source=str(source),
        supporting_ids=_strings(row.get("supporting_ids", []), "supporting_ids", where),
        oracle_queries=_strings(row.get("oracle_queries", []), "oracle_queries", where),
        meta={k: v for k, v in row.items() if k not in QA_FIELDS})


def passage_from_row(row: dict, where: str) -> Passage:
    """One corpus row as a ``Passage``: ``contents``, or ``title`` plus ``text``."""
    if "id" not in row:
        raise JsonlFormatError(f"{where}: missing key 'id'")
    if isinstance(row.get("contents"), str):
        return Passage(str(row["id"]), row["contents"])
    if isinstance(row.get("title"), str) and isinstance(row.get("text"), str):
        return Passage(str(row["id"]), f'"{row["title"]}"\n{row["text"]}')
    raise JsonlFormatError(f"{where}: needs a string 'contents' (or 'title' and 'text')")


def load_qa_jsonl(path: str | Path, default_source: str | None = None) -> list[QAExample]:
    """All questions of a FlashRAG / Search-R1 JSONL file (``.jsonl`` or ``.jsonl.gz``)."""
    return [qa_from_row(row, where, default_source) for where, row in iter_jsonl(path)]


def load_corpus_jsonl(path: str | Path) -> list[Passage]:
    """All passages of a corpus JSONL file, in file order."""
    return [passage_from_row(row, where) for where, row in iter_jsonl(path)]


@dataclass
class LabJsonlConfig:
    """Schema of ``data=lab_jsonl``: question and corpus files in the FlashRAG layout."""

    name: str = "lab_jsonl"  # dataset name, used in logs and output paths
    train_path: str = MISSING  # training questions (.jsonl or .jsonl.gz)
    dev_path: str = MISSING  # evaluation questions
    test_path: str | None = None  # held-out questions; none gives an empty test split
    corpus_path: str | None = None  # corpus for a local retriever; none when search is remote
    data_source: str | None = None  # data_source for rows that lack one (else such rows fail)


def load_lab_jsonl(cfg: LabJsonlConfig) -> Dataset:
    """Load the splits (and corpus, if given) named by ``cfg``; relative paths are from the CWD."""
    def questions(path: str | None) -> list[QAExample]:
        return load_qa_jsonl(path, cfg.data_source) if path else []

    corpus = load_corpus_jsonl(cfg.corpus_path) if cfg.corpus_path else None
    return Dataset(questions(cfg.train_path), questions(cfg.dev_path), questions(cfg.test_path),
                   corpus=corpus)
