"""Questions and a corpus → a local ``data=nq_hotpotqa`` folder, for the paper preset offline.

    uv run python experiments/benchmarks/paper_preset_data.py --world --out .pg
    uv run python experiments/benchmarks/paper_preset_data.py <folder with questions.jsonl and corpus.jsonl> --out .pg

``--world`` takes the embedded world (``data=world``: its train questions, then its test
questions, and its corpus), so the command runs on a fresh clone with nothing downloaded; a
folder gives its own ``questions.jsonl`` (FlashRAG rows: id, question, golden_answers,
data_source) and ``corpus.jsonl`` (id, contents). Either way it writes ``train.parquet`` and
``test.parquet`` (the Search-R1 columns the loader reads; the last ``--test`` questions are
the test split) and ``corpus.jsonl``, so the paper preset runs where nothing can be
downloaded (the GPU machine), with our prompt instead of the rows' official one:

    uv run python -m searchr1.main experiment=paper_grpo data.source=local data.local_dir=.pg \\
        retriever.corpus_path=.pg/corpus.jsonl protocol.prompt=ours \\
        model.hf_id=/tmp/qwen3b model.gguf_file=null trainer.steps=1 trainer.save_every=1

A missing folder or file ends with one paragraph and exit 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pandas as pd

COLUMNS = ("id", "question", "golden_answers", "data_source")
EXIT_BAD_INPUT = 2


def world_rows() -> tuple[list[dict], list[dict]]:
    """(question rows, corpus rows) of the embedded world: train questions, then test ones."""
    from searchr1.data.world import WorldConfig, generate_world

    world = generate_world(WorldConfig())
    questions = [{"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
                  "data_source": q.data_source} for q in [*world.train, *world.test]]  # COLUMNS
    return questions, [p.to_row() for p in world.corpus or []]


def write(rows: list[dict], out: Path, test: int) -> tuple[int, int]:
    """Write the two parquet files; returns (train, test) row counts."""
    if len(rows) <= test:
        raise ValueError(f"{len(rows)} questions, need more than --test {test}")
    frame = pd.DataFrame([{k: r[k] for k in COLUMNS} for r in rows])
    out.mkdir(parents=True, exist_ok=True)
    frame.iloc[:-test].to_parquet(out / "train.parquet", index=False)
    frame.iloc[-test:].to_parquet(out / "test.parquet", index=False)
    return len(frame) - test, test


def convert(source: Path, out: Path, test: int) -> tuple[int, int]:
    """A folder's ``questions.jsonl`` and ``corpus.jsonl`` → ``out``; returns (train, test)."""
    missing = [name for name in ("questions.jsonl", "corpus.jsonl") if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{source} has no {' and no '.join(missing)}")
    rows = [json.loads(line) for line in (source / "questions.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    counts = write(rows, out, test)
    shutil.copyfile(source / "corpus.jsonl", out / "corpus.jsonl")
    return counts


def convert_world(out: Path, test: int) -> tuple[int, int]:
    """The embedded world → ``out``; returns (train, test)."""
    questions, corpus = world_rows()
    counts = write(questions, out, test)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in corpus)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, nargs="?", help="folder with questions.jsonl and corpus.jsonl")
    parser.add_argument("--world", action="store_true", help="use the embedded world instead of a folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--test", type=int, default=20, help="questions kept for the test split")
    args = parser.parse_args(argv)
    if (args.source is None) == (not args.world):
        parser.error("give a folder with questions.jsonl and corpus.jsonl, or --world")
    try:
        train, test = convert_world(args.out, args.test) if args.world else convert(args.source, args.out, args.test)
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, json.JSONDecodeError) as err:
        what = f"{type(err).__name__}: {err}" if isinstance(err, (KeyError, json.JSONDecodeError)) else str(err)
        print(f"paper_preset_data: cannot convert ({what}). Give a folder holding questions.jsonl "
              "(one JSON object a line: id, question, golden_answers, data_source) and corpus.jsonl "
              "(id, contents), or --world for the embedded world's questions and corpus.",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{args.out}: train.parquet {train} rows, test.parquet {test} rows, corpus.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
