"""``DataParallel``: the one object the loop and the engine use for data parallelism.

The trainer and the step call its methods unconditionally; with one process (``SINGLE``, a
plain ``python -m searchr1.main``) each is the identity or a local count, so there is one code
path. The engine gets it handed in (it never imports this package) and reads the members
``engines/base.py: DataParallelGroup`` declares: its place, ``guard``, ``broadcast``, ``barrier``
and the gradient bucket size its own all-reduce uses (``engines/local/sharding/grads.py``). Under ``torchrun`` every collective runs inside ``_guard``: a peer
that died or stopped answering within ``timeout_s`` turns into ``RankLost`` (exit 1 with a
paragraph naming the silent rank) instead of a hang or a bare backend traceback.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from searchr1.distributed import reduce, split

EXIT_RANK_LOST = 1


class RankLost(SystemExit):
    """A collective failed: another rank died or hung (message names it where known)."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_RANK_LOST)
        self.message = message


@dataclass
class DataParallel:
    """This process's place in the job and the collectives the loop needs."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    timeout_s: float = 600.0
    bucket_mb: float = 25.0  # gradient all-reduce buckets (engines/local/sharding/grads.py)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    # ----- work split -----------------------------------------------------------------------
    def split_groups(self, examples: list) -> list:
        """This rank's questions of a step (whole groups, ``split.py``)."""
        return split.split_questions(list(examples), self.world, self.rank)

    def split_eval(self, examples: list) -> list:
        """This rank's eval questions (blocks differ by ≤ 1; gathered back in order)."""
        return [examples[i] for i in split.rank_block(len(examples), self.world, self.rank)]

    def minibatches(self, n_local: int, size: int) -> list[split.MinibatchShare]:
        """This rank's share of each global mini-batch of ``size`` datums."""
        counts = [int(c) for c in self.all_sum_each(n_local)]
        return split.global_minibatches(counts, self.rank, size)

    # ----- collectives ----------------------------------------------------------------------
    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        if not self.active:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        with self._guard("all_sum"):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def all_sum_each(self, value: float) -> list[float]:
        """Every rank's ``value``, in rank order."""
        vec = [0.0] * self.world
        vec[self.rank] = float(value)
        return self.all_sum(vec)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on some rank."""
        return self.all_sum([float(bool(flag))])[0] > 0

    def sum_counts(self, counts):
        """A dataclass of numbers with every field summed over ranks (same type back)."""
        names = [f.name for f in fields(counts)]
        summed = self.all_sum([getattr(counts, n) for n in names])
        kinds = [type(getattr(counts, n)) for n in names]
        return type(counts)(**{n: k(v) for n, k, v in zip(names, kinds, summed)})

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out = [None] * self.world
        with self._guard("gather"):
            dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        with self._guard("broadcast"):
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            with self._guard("barrier"):
                dist.barrier()

    def reduce_metrics(self, metrics: dict, weights: dict, table=reduce.STEP) -> dict:
        """The job's metrics from every rank's (``reduce.py``; identity on one process)."""
        if not self.active:
            return dict(metrics)
        return reduce.reduce_gathered(self.gather((dict(metrics), dict(weights))), table)

    # ----- failure --------------------------------------------------------------------------
    def guard(self, what: str):
        """A block of collectives named ``what``: a lost peer there becomes ``RankLost``."""
        return self._guard(what)

    @contextlib.contextmanager
    def _guard(self, what: str):
        try:
            yield
        except (RuntimeError, dist.DistError) as err:
            raise RankLost(self._lost_message(what, err)) from None

    def _lost_message(self, what: str, err: BaseException) -> str:
        silent = _silent_ranks(self.timeout_s)
        who = (f"rank(s) {', '.join(map(str, silent))} did not answer" if silent
               else "a peer rank died or stopped answering")
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        return (f"searchr1: rank {self.rank} of {self.world}: the {what} failed: {who} "
                f"(collective timeout distributed.timeout_s={self.timeout_s:g} s; {first}). "
                f"The job stops; torchrun's summary names the first rank that failed. Resume "
                f"from the last checkpoint with the same --nproc-per-node and trainer.resume=auto.")


def _silent_ranks(timeout_s: float) -> list[int]:
    """Ranks that do not check in on the rendezvous store within a few seconds of a failed
    collective (every surviving rank checks in from this same error path), or [] when the
    store itself is gone."""
    import time

    try:
        store = dist.distributed_c10d._get_default_store()
        me, world = dist.get_rank(), dist.get_world_size()
        store.set(f"searchr1/alive/{me}", "1")
        deadline = time.monotonic() + min(5.0, timeout_s)
        while True:
            silent = [r for r in range(world) if not store.check([f"searchr1/alive/{r}"])]
            if not silent or time.monotonic() > deadline:
                return silent
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 — the store died with its host: say what we can
        return []


SINGLE = DataParallel()

