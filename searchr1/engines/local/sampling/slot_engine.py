"""The slot sampler: continuous batching over a fixed pool of KV-cache slots, CUDA-graph decode.

One worker thread owns the pool. It loops:

1. **admit** waiting sequences into idle slots (``SlotTable.place``): copy shared prefixes,
   prefill only the prompt tokens not already cached (a trajectory's next turn prefills just
   the appended observation), then arm the slot's decode state — every window, or with
   ``engine.admit_every=N`` at most every N-th window while rows decode (one prefill for more
   sequences: each admission round is an eager forward, launch-bound for small models);
2. run ``sync_every`` **decode steps** — one token for every live slot per step, shapes fixed,
   replayed from a captured CUDA graph per (attention length bucket, filtered sampling, rows)
   variant; EOS and ``max_tokens`` end a row on the device. The rows are the whole pool, or,
   with ``engine.compact_decode`` and at most a third of the pool live, only the live slots
   (padded with idle ones to a power of two, or a multiple of 64), whose keys are gathered;
3. **sync** once: read the window's tokens and log-probs, check stop strings on the host, finish
   sequences (their slot keeps its KV for the next turn), resolve finished requests.

With ``engine.admit_behind_window`` a round that admits while rows decode runs 2 before 1: the
window is queued first and the admission's kernels behind it, so its host work overlaps the
window on the device; the admitted rows decode from the next window.

A finished row's slot takes the next waiting sequence at the next admission, without stopping
the loop. The policy's weights are a merged copy (``SlotWeights``): when a request comes from
different weights (after ``optim_step``, or the adapters-off base model), the worker drains the
pool, folds the new weights in place and forgets every cached prefix.

Reproducibility: a sequence's tokens depend only on its prompt, its seed and the weights (see
``select``), never on batching, refills or prefix reuse, and equal the HF decode's.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import torch

from searchr1.engines.local.sampling.prefill import PrefillGraphs, chunks, run_eager
from searchr1.engines.local.sampling.slot_model import (KVCache, LayerFns, SlotWeights, compiled_layer_fns,
                                                      layer_post, layer_pre)
from searchr1.engines.local.sampling.select import select
from searchr1.engines.local.sampling.slot_decode import DecodeState, attention_bucket, compacted_rows, decode_step
from searchr1.engines.local.sampling.slot_table import SlotTable
from searchr1.engines.local.sampling.slot_types import SlotRequest, SlotSeq, SlotStats, WeightsSource, Window
from searchr1.engines.local.sampling.stops import STOP
from searchr1.engines.local.sampling.upload import upload
from searchr1.engines.local.sampling.worker import EngineWorker
from searchr1.utils.lazy import lazy

if TYPE_CHECKING:
    from searchr1.engines.local.config import LocalEngineConfig

log = logging.getLogger(__name__)

FLEX = "searchr1.engines.local.sampling.flex_decode"  # imported only for engine.decode_attention=flex


class SlotEngine(EngineWorker):
    """A pool of ``kv_slots`` slots of ``max_seq_len`` tokens on one device, fed by ``submit``."""

    def __init__(self, model, cfg: LocalEngineConfig, eos_ids, device: torch.device, dtype: torch.dtype,
                 vocab_limit: int = 0) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.vocab_limit = vocab_limit  # picks stay below the tokenizer's length (see select)
        self.max_len, self.window = cfg.max_seq_len, max(1, cfg.sync_every)
        self.admit_every, self._since_admit = max(1, cfg.admit_every), 0
        self.admit_behind = bool(cfg.admit_behind_window)
        self.weights = SlotWeights(model, self.device, dtype, self.max_len)
        self.cache = KVCache(self.weights.dims, cfg.kv_slots, self.max_len, self.device, dtype)
        self.table = SlotTable(cfg.kv_slots, self.max_len)
        self.state = DecodeState(cfg.kv_slots, self.window, sorted(eos_ids), self.device)
        self._eos = frozenset(int(t) for t in eos_ids)
        self.use_graphs = bool(cfg.cuda_graphs) and self.device.type == "cuda"
        compiled = cfg.compile_decode and self.device.type == "cuda"
        flex = lazy(FLEX) if cfg.decode_attention == "flex" else None
        post = flex.layer_post_flex if flex else layer_post
        self._flex = flex.FlexDecodeMask(cfg.kv_slots, self.device) if flex else None
        eager = LayerFns(layer_pre, post) if flex else None  # None: slot_model.EAGER
        self._layer_fns = compiled_layer_fns(post=post) if compiled else eager
        self._select = torch.compile(select, dynamic=False) if compiled else select
        self.compact = bool(cfg.compact_decode)
        # compacted steps vary their row count: one shape-generic compile instead of one per size
        self._compact_fns = compiled_layer_fns(dynamic=True, post=post) if compiled and self.compact else eager
        # admission rounds vary rows and width: shape-generic too (any device, so CPU tests hold it
        # equal to the eager prefill)
        self._prefill_fns = compiled_layer_fns(dynamic=True) if cfg.compile_prefill else None
        self._row_index: dict[int, torch.Tensor] = {}  # rows -> the slots a compacted step decodes
        self.stats = SlotStats()
        self._graphs: dict[tuple[int, bool, int], torch.cuda.CUDAGraph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        # admission rounds at padded shapes (any device), replayed as CUDA graphs where there are graphs
        self._pad_prefill = bool(cfg.prefill_graphs)
        self._prefill_graphs = PrefillGraphs(self.device, self._pool, self.stats) if self.use_graphs else None
        self._identity: tuple | None = None
        self._start_worker("slot-sampler")  # _queue: (SlotSeq, SlotRequest); _live: slot → the same

    # ----- public ---------------------------------------------------------------------------
    def submit(self, seqs: list[SlotSeq], source: WeightsSource) -> Future:
        """Queue the sequences of one request; the future resolves to the same list, finished."""
        request = SlotRequest(seqs, source, Future(), len(seqs))
        request.future.set_running_or_notify_cancel()
        self._enqueue((s, request) for s in seqs)
        return request.future

    def length_cap(self, prompt_len: int) -> int:
        """Most tokens a sequence with this prompt can generate inside one slot."""
        return self.max_len - prompt_len + 1

    # ----- worker (the loop: worker.py) -------------------------------------------------------
    def _worker_context(self):
        return torch.inference_mode()

    def _take(self) -> list[tuple[SlotSeq, SlotRequest]]:
        """Wake a sleeping pool for queued work; admit every ``admit_every``-th window (or idle)."""
        if self._queue and self.asleep:
            self._wake()
        due = not self._live or self._since_admit + 1 >= self.admit_every
        return self._take_admissions() if due else []

    def _serve(self, admitted: list[tuple[SlotSeq, SlotRequest]]) -> None:
        if admitted and self._live and self.admit_behind:
            window = self._launch_window()  # the live rows' window runs on the GPU while the
            admit = self.stats.admit_seconds  # host launches the admission behind it
            self._admit(admitted)
            self._since_admit = 1  # the window launched before it counts, as in the serial order
            self.stats.admitted_behind += 1
            self._sync(window, overlapped=self.stats.admit_seconds - admit)
            return
        self._admit(admitted)
        if self._live:
            self._decode_window()

    def _take_admissions(self) -> list[tuple[SlotSeq, SlotRequest]]:
        """Pop the sequences that get a slot now (FIFO); switch weights when the pool is empty."""
        admitted: list[tuple[SlotSeq, SlotRequest]] = []
        reserved = np.zeros(self.table.slots, dtype=bool)
        primaries: dict[int, int] = {}  # request -> slot of its first sample placed this round
        while self._queue:
            seq, request = self._queue[0]
            identity = request.source.identity()
            if identity != self._identity:
                if self._live or admitted:
                    break  # drain the pool before the weights change
                self._fold(request.source, identity)
            primary = primaries.get(id(request))
            if primary is None:
                placement = self.table.place(seq.prompt, reserved)
            else:
                placement = self.table.place_sibling(primary, seq.prompt, reserved)
            if placement is None:
                break
            reserved[placement.slot] = True
            primaries.setdefault(id(request), placement.slot)
            seq.slot, seq.placement = placement.slot, placement
            admitted.append((seq, request))
            self._queue.popleft()
        return admitted

    def _sleep(self) -> None:
        """Drop the KV pool and the captured graphs (which point into it); keep the weights."""
        if self.asleep:
            return
        self._graphs.clear()
        self.cache, self.asleep = None, True  # type: ignore[assignment]
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        if self._prefill_graphs is not None:
            self._prefill_graphs.clear(self._pool)
        self.table.invalidate()
        self.stats.sleeps += 1
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _wake(self) -> None:
        """Allocate the KV pool again (graphs are re-captured as decode needs them)."""
        start = time.perf_counter()
        w = self.weights
        self.cache = KVCache(w.dims, self.table.slots, self.max_len, self.device, w.dtype)
        self.asleep = False
        self.stats.wake_seconds += time.perf_counter() - start

    def _fold(self, source: WeightsSource, identity: tuple) -> None:
        lock = source.lock
        if lock is not None:
            with lock:
                self.weights.fold(source.model)
        else:
            self.weights.fold(source.model)
        self.table.invalidate()
        self._identity = identity
        self.stats.folds += 1

    def _admit(self, admitted: list[tuple[SlotSeq, SlotRequest]]) -> None:
        """Copies, then prefills, then sibling copies, then the decode state of each sequence."""
        if not admitted:
            return
        start, self._since_admit = time.perf_counter(), 0
        self.stats.admissions += 1
        placements = [s.placement for s, _ in admitted]
        for p in placements:
            if p.copy_from is not None and not p.after_prefill:
                self.cache.copy_prefix(p.copy_from, p.slot, p.reused)
            counter = "copied_tokens" if p.copy_from is not None else "reused_tokens"
            setattr(self.stats, counter, getattr(self.stats, counter) + p.reused)
        self._prefill([(s.slot, s.prompt[s.placement.reused : len(s.prompt) - 1], s.placement.reused)
                       for s, _ in admitted if s.placement.reused < len(s.prompt) - 1])
        for p in placements:
            if p.after_prefill:
                self.cache.copy_prefix(p.copy_from, p.slot, p.reused)
        for seq, request in admitted:
            self.table.occupy(seq.slot, seq.prompt)
            self._live[seq.slot] = (seq, request)
        self._arm([s for s, _ in admitted])
        self.stats.admit_seconds += time.perf_counter() - start

    def _prefill(self, rows: list[tuple[int, np.ndarray, int]]) -> None:
        """Write the KV of each row's tokens at positions ``start …`` of its slot, in chunks."""
        for chunk in chunks(rows, self.max_len, self._pad_prefill):
            if self._pad_prefill and self._prefill_graphs is not None:
                try:
                    self._prefill_graphs.run(chunk, self.weights, self.cache, self._prefill_fns)
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as error:  # noqa: BLE001 - a failed capture; eager writes the same keys
                    log.warning("prefill graph capture failed (%s: %s); prefilling eagerly from now on",
                                type(error).__name__, error)
                    self._prefill_graphs = None
                    run_eager(chunk, self.weights, self.cache, self._prefill_fns, self.device)
            else:
                run_eager(chunk, self.weights, self.cache, self._prefill_fns, self.device)
            self.stats.prefill_tokens += chunk.tokens
            self.stats.prefill_chunks += 1

    def _arm(self, seqs: list[SlotSeq]) -> None:
        """Set the decode state of newly admitted slots (one small host→device copy per field)."""
        st = self.state
        idx = upload([s.slot for s in seqs], self.device)
        values = {
            st.last_tok: [int(s.prompt[-1]) for s in seqs],
            st.pos: [len(s.prompt) - 1 for s in seqs],
            st.out_len: [0] * len(seqs),
            st.max_new: [s.max_new for s in seqs],
            st.top_k: [s.sampling.top_k for s in seqs],
            st.seed: [s.seed for s in seqs],
            st.temp: [s.sampling.temperature for s in seqs],
            st.top_p: [s.sampling.top_p for s in seqs],
            st.active: [True] * len(seqs),
        }
        for tensor, vals in values.items():
            tensor.index_copy_(0, idx, upload(vals, self.device, tensor.dtype))
        self.stats.sequences += len(seqs)

    # ----- decoding -------------------------------------------------------------------------
    def _rows(self, live: int) -> int:
        """Rows a decode step computes (``compacted_rows``; the pool when compaction is off)."""
        return compacted_rows(live, self.table.slots) if self.compact else self.table.slots

    def _index(self, rows: int) -> torch.Tensor | None:
        """The slots of a compacted step (live ones, then idle ones), in its fixed buffer; None = all."""
        if rows == self.table.slots:
            return None
        live = sorted(self._live)
        idle = islice((s for s in range(self.table.slots) if s not in self._live), rows - len(live))
        buffer = self._row_index.get(rows)
        if buffer is None:
            buffer = self._row_index[rows] = torch.zeros(rows, dtype=torch.int64, device=self.device)
        buffer.copy_(torch.tensor([*live, *idle], dtype=torch.int64))
        return buffer

    def _decode_window(self) -> None:
        self._sync(self._launch_window())

    def _launch_window(self) -> Window:
        """Queue ``sync_every`` decode steps of the live rows on the device (no wait)."""
        start = time.perf_counter()
        rows_in_flight = list(self._live.items())
        live = [row for _, row in rows_in_flight]
        furthest = max(len(s.prompt) - 1 + len(s.tokens) for s, _ in live)
        length = attention_bucket(furthest + self.window, self.max_len)
        filtered = any(s.sampling.filtered for s, _ in live)
        rows = self._rows(len(live))
        index = self._index(rows)
        self.state.col.zero_()
        step = None
        if self.use_graphs:
            try:
                step = self._graph(length, filtered, index)
            except Exception as error:  # noqa: BLE001 - a compile failure of the shape-generic layer
                if index is None:
                    raise
                log.warning("compacted decode step failed to compile or capture (%s: %s); decoding "
                            "the whole pool from now on", type(error).__name__, error)
                self.compact, index = False, None
                step = self._graph(length, filtered, None)
        for _ in range(self.window):
            if step is not None:
                step.replay()
            else:
                self._decode_step(length, filtered, index)
        self.stats.decode_steps += self.window
        self.stats.live_row_steps += len(live) * self.window  # an upper count: rows may end mid-window
        self.stats.windows += 1
        self._since_admit += 1
        self.stats.compacted_windows += index is not None
        return Window(start, rows_in_flight)

    def _decode_step(self, length: int, filtered: bool, index: torch.Tensor | None = None) -> None:
        """One token for every row (the pool, or the slots in ``index``); pure device work."""
        decode_step(self.state, self.weights, self.cache, length, filtered, index,
                    self._layer_fns if index is None else self._compact_fns,
                    select if (filtered or index is not None) else self._select, self.vocab_limit, self._flex)

    def _graph(self, length: int, filtered: bool, index: torch.Tensor | None) -> torch.cuda.CUDAGraph:
        """The captured decode step for this variant (captured on first use, state preserved)."""
        key = (length, filtered, self.table.slots if index is None else index.shape[0])
        if key not in self._graphs:
            t0 = time.perf_counter()
            saved = [t.clone() for t in self.state.tensors()]
            try:
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self._decode_step(length, filtered, index)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                    self._decode_step(length, filtered, index)
            finally:  # warm-up steps advanced the state: put it back (also when capture fails)
                for tensor, value in zip(self.state.tensors(), saved):
                    tensor.copy_(value)
            torch.cuda.synchronize(self.device)
            self._graphs[key] = graph
            self.stats.graphs += 1
            self.stats.capture_seconds += time.perf_counter() - t0
        return self._graphs[key]

    def _sync(self, window: Window, overlapped: float = 0.0) -> None:
        """Read the window back (one transfer), apply host-side stops, finish its sequences.

        ``decode_seconds`` counts from the window's launch through the transfer, before any
        sequence finishes (a caller woken by its result reads the window already counted), less
        ``overlapped``: an admission's host time spent behind it (counted in ``admit_seconds``).
        Only the rows in flight in the window are read: rows admitted behind it start next window."""
        st, w = self.state, self.window
        packed = torch.cat([st.ring_tok, st.ring_lp.view(torch.int32).long(), st.active[:, None].long(),
                            st.out_len[:, None]], dim=1).cpu().numpy()
        self.stats.decode_seconds += time.perf_counter() - window.start - overlapped
        ring_tok, ring_lp = packed[:, :w], packed[:, w : 2 * w].astype(np.int32).view(np.float32)
        active, out_len = packed[:, 2 * w].astype(bool), packed[:, 2 * w + 1]
        stopped: list[int] = []
        for slot, (seq, request) in window.rows:
            new = int(out_len[slot]) - len(seq.tokens)
            seq.tokens += ring_tok[slot, :new].tolist()
            seq.logprobs += ring_lp[slot, :new].tolist()
            ending = seq.stop.check(seq.tokens, new)
            if ending is not None:
                del seq.tokens[ending.length :], seq.logprobs[ending.length :]
                reason = ending.reason
            elif not active[slot]:
                reason = STOP  # the device stopped it on an engine EOS id the rule lacks
            else:
                continue
            if active[slot]:
                stopped.append(slot)
            self._finish(seq, request, reason)
        if stopped:
            st.active.index_fill_(0, torch.tensor(stopped, device=self.device), False)

    def _finish(self, seq: SlotSeq, request: SlotRequest, reason: str) -> None:
        seq.stop_reason = reason
        del self._live[seq.slot]
        self.table.release(seq.slot, seq.prompt, seq.tokens)
        request.pending -= 1
        if request.pending == 0 and not request.future.done():
            request.future.set_result(request.seqs)

    def _fail_all(self, error: BaseException, admitted) -> None:
        """A device error fails every request in flight (and their queued samples); the pool resets."""
        failed = {id(r): r for _, r in [*self._live.values(), *admitted]}
        with self._cv:
            kept = [(s, r) for s, r in self._queue if id(r) not in failed]
            self._queue.clear()
            self._queue.extend(kept)
        self._live.clear()
        self.table.busy[:] = False
        self.table.invalidate()
        self.state.active.zero_()
        for request in failed.values():
            if not request.future.done():
                request.future.set_exception(error)

