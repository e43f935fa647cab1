"""Build a dense index: ``python -m searchr1.retrievers.build_index``.

    uv run python -m searchr1.retrievers.build_index --corpus wiki.jsonl --out indexes/wiki \\
        --model intfloat/e5-base-v2 --index-type flat        # or --model minilm (offline)

A progress bar counts encoded passages; an interrupted build resumes from its last complete
shard when rerun with the same arguments. The layout and the resume rules are described in
``searchr1/retrievers/dense_build.py``.
"""

from __future__ import annotations

import argparse
import json

from searchr1.retrievers.dense_build import META_FILE, build
from searchr1.retrievers.dense_encoder import TextEncoder
from searchr1.retrievers.faiss_index import INDEX_TYPES, IndexSpec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, help='corpus JSONL of {"id", "contents"} rows')
    p.add_argument("--out", required=True, help="output folder (index.faiss, meta.json, …)")
    p.add_argument("--model", default="intfloat/e5-base-v2", help="encoder path/id, or minilm")
    p.add_argument("--query-prefix", default=None, help="default: the model's ('' for minilm)")
    p.add_argument("--passage-prefix", default=None)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--fp16", action="store_true", help="half precision on GPU")
    p.add_argument("--index-type", choices=INDEX_TYPES, default="flat")
    p.add_argument("--hnsw-m", type=int, default=32)
    p.add_argument("--ivf-nlist", type=int, default=1024)
    p.add_argument("--pq-m", type=int, default=64)
    p.add_argument("--pq-nbits", type=int, default=8)
    p.add_argument("--shard-size", type=int, default=50_000)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    encoder = TextEncoder(
        args.model, args.query_prefix, args.passage_prefix, args.max_length,
        args.batch_size, args.device, args.fp16,
    )
    spec = IndexSpec(args.index_type, hnsw_m=args.hnsw_m, ivf_nlist=args.ivf_nlist,
                     pq_m=args.pq_m, pq_nbits=args.pq_nbits)
    out = build(args.corpus, args.out, encoder, spec, args.shard_size)
    print(f"index ready: {out} ({json.loads((out / META_FILE).read_text())['count']} passages)")


if __name__ == "__main__":
    main()
