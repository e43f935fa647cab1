"""Writing questions and passages as FlashRAG / Search-R1 JSONL rows: the inverse of
``searchr1/data/jsonl.py``'s readers, for tests that round-trip them or need a data file."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from searchr1.data.jsonl import QA_FIELDS
from searchr1.data.types import Dataset, Passage, QAExample, SPLITS


def qa_to_row(example: QAExample) -> dict:
    """A ``QAExample`` as a flat JSONL row; empty optional fields are left out."""
    row: dict = {"id": example.id, "question": example.question,
                 "golden_answers": list(example.golden_answers), "data_source": example.data_source}
    if example.supporting_ids:
        row["supporting_ids"] = list(example.supporting_ids)
    if example.oracle_queries:
        row["oracle_queries"] = list(example.oracle_queries)
    clash = sorted(set(example.meta) & set(QA_FIELDS))
    if clash:
        raise ValueError(f"meta of {example.id!r} reuses reserved key(s) {clash}")
    row.update(example.meta)
    return row


def write_rows(rows: Iterable[dict], path: str | Path) -> None:
    """One JSON object per line (UTF-8, gzip when the name ends in ``.gz``), parents created."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    gz = path.suffix == ".gz"
    with gzip.open(path, "wt", encoding="utf-8") if gz else path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_corpus_jsonl(passages: Iterable[Passage], path: str | Path) -> None:
    """Passages as ``{"id", "contents"}`` rows."""
    write_rows((p.to_row() for p in passages), path)


def write_qa_jsonl(examples: Iterable[QAExample], path: str | Path) -> None:
    """Questions as flat rows (``qa_to_row``)."""
    write_rows((qa_to_row(e) for e in examples), path)


def world_to_rows(dataset: Dataset) -> dict[str, list[dict]]:
    """JSONL-ready rows: ``{"corpus": [...], "train": [...], "dev": [...], "test": [...]}``."""
    rows: dict[str, list[dict]] = {"corpus": [p.to_row() for p in dataset.corpus or []]}
    for split in SPLITS:
        rows[split] = [qa_to_row(example) for example in dataset.split(split)]
    return rows
