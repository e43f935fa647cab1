"""A retrieval server in its own process (``python -m searchr1.retrievers.server``) on
127.0.0.1, over a generated BM25 corpus; used by the load test and the limits benchmark."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VOCAB = [f"{c}{v}{n}" for c in "bdfgklmnprstvz" for v in "aeiou" for n in range(30)]


def pseudo_words(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` Zipf-distributed words of a 2,100-word vocabulary."""
    ranks = np.minimum(rng.zipf(1.2, size=n) - 1, len(VOCAB) - 1)
    return [VOCAB[r] for r in ranks]


def write_corpus(path: Path, passages: int, words: int = 40, seed: int = 0) -> Path:
    """A corpus JSONL of ``passages`` rows (``{"id", "contents"}``, '"Title"\\ntext')."""
    rng = np.random.default_rng(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(passages):
            text = " ".join(pseudo_words(rng, words))
            out.write(json.dumps({"id": str(i), "contents": f'"Page {i}"\n{text}'}) + "\n")
    return path


def queries(n: int, seed: int = 1, tag: str = "q") -> list[str]:
    """``n`` distinct five-word queries (a unique tail word keeps every one a cache miss)."""
    rng = np.random.default_rng(seed)
    return [" ".join(pseudo_words(rng, 5)) + f" {tag}{i}" for i in range(n)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen

    def memory_kib(self, field: str = "VmHWM") -> int:
        """``VmHWM`` (peak resident set) or ``VmRSS`` of the server, in KiB (Linux)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise KeyError(field)


@contextmanager
def server_process(corpus: Path, run_dir: Path, overrides: list[str] = (),
                   start_timeout_s: float = 120) -> Iterator[ServerProcess]:
    """``python -m searchr1.retrievers.server retriever=bm25`` over ``corpus`` on a free
    port, ready (``/health`` answers) on entry, terminated on exit."""
    port = free_port()
    argv = [sys.executable, "-m", "searchr1.retrievers.server", "retriever=bm25",
            f"retriever.corpus_path={corpus}", f"server.port={port}",
            f"hydra.run.dir={run_dir}", "hydra.output_subdir=null", *overrides]
    log = (run_dir.parent / f"{run_dir.name}.log").open("w")
    process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited ({process.returncode}): "
                                   f"{Path(log.name).read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the retrieval server did not start")
            time.sleep(0.1)
        yield ServerProcess(url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def small_clients(url: str, per_client: list[list[str]], topk: int = 3) -> list[float]:
    """Concurrent clients, each sending its queries one per request in turn; the seconds each
    request took (every answer must be a 200 with one result list)."""
    async def client(i: int, own: list[str], http: httpx.AsyncClient) -> list[float]:
        out = []
        for query in own:
            start = time.perf_counter()
            r = await http.post(f"{url}/retrieve", json={"queries": [query], "topk": topk})
            out.append(time.perf_counter() - start)
            assert r.status_code == 200 and len(r.json()["result"]) == 1, r.text[:200]
            await asyncio.sleep(0.02 * (i % 3))  # stagger the clients
        return out

    async with httpx.AsyncClient(timeout=120) as http:
        times = await asyncio.gather(*(client(i, own, http) for i, own in enumerate(per_client)))
    return [t for own in times for t in own]
