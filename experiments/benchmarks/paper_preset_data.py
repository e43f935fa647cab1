"""Questions and a corpus in JSONL (FlashRAG layout) → a local ``data=nq_hotpotqa`` folder.

    python experiments/benchmarks/paper_preset_data.py ../shared/data/hotpotqa_mini --out .pg

writes ``train.parquet`` and ``test.parquet`` (the Search-R1 columns the loader reads: id,
question, golden_answers, data_source; the last ``--test`` questions are the test split) and
copies ``corpus.jsonl``, so the paper preset runs where nothing can be downloaded (the GPU
machine), with our prompt instead of the rows' official one:

    python -m searchr1.main experiment=paper_grpo data.source=local data.local_dir=.pg \\
        retriever.corpus_path=.pg/corpus.jsonl protocol.prompt=ours \\
        model.hf_id=/tmp/qwen3b model.gguf_file=null trainer.steps=1 trainer.save_every=1
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pandas as pd

COLUMNS = ("id", "question", "golden_answers", "data_source")


def convert(source: Path, out: Path, test: int) -> tuple[int, int]:
    """Write the two parquet files and the corpus; returns (train, test) row counts."""
    rows = [json.loads(line) for line in (source / "questions.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    if len(rows) <= test:
        raise SystemExit(f"{source}: {len(rows)} questions, need more than --test {test}")
    frame = pd.DataFrame([{k: r[k] for k in COLUMNS} for r in rows])
    out.mkdir(parents=True, exist_ok=True)
    frame.iloc[:-test].to_parquet(out / "train.parquet", index=False)
    frame.iloc[-test:].to_parquet(out / "test.parquet", index=False)
    shutil.copyfile(source / "corpus.jsonl", out / "corpus.jsonl")
    return len(frame) - test, test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="folder with questions.jsonl and corpus.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--test", type=int, default=20, help="questions kept for the test split")
    args = parser.parse_args()
    train, test = convert(args.source, args.out, args.test)
    print(f"{args.out}: train.parquet {train} rows, test.parquet {test} rows, corpus.jsonl")


if __name__ == "__main__":
    main()
