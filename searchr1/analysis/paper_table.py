"""The paper's eval table (Search-R1, Table 2 layout): EM per benchmark and their average.

Seven benchmarks in the paper's column order — general QA (NQ, TriviaQA, PopQA), then
multi-hop QA (HotpotQA, 2WikiMultiHopQA, Musique, Bamboogle) — and ``Avg.``, the
unweighted mean of the seven columns. Each EM is what the official scorer
(``qa_em.compute_score_em``) gives: a response without a closed ``<answer>`` is scored as
the prompt's example answer (see ``rewards/em_format_paper.py``), so it can differ from
the lab's EM (``eval/em/*``, response only) on a question whose gold is that example.

The lab's macro EM is shown beside it, computed from the same trajectories: both are
means over sources, so on the seven benchmarks they differ only by that scoring rule, and
by the sources counted when a run evaluates data outside the seven.

Metrics: ``eval/paper_em/<source>`` for each benchmark present and ``eval/paper_em/avg``
over those present (``eval/paper_em/benchmarks`` says how many: the paper's is 7).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from searchr1.rewards.em_format_paper import official_answer
from searchr1.rewards.normalize import exact_match

#: (data_source, column title) in the paper's Table 2 order
BENCHMARKS = (
    ("nq", "NQ"),
    ("triviaqa", "TriviaQA"),
    ("popqa", "PopQA"),
    ("hotpotqa", "HotpotQA"),
    ("2wikimultihopqa", "2wiki"),
    ("musique", "Musique"),
    ("bamboogle", "Bamboogle"),
)
PREFIX = "eval/paper_em/"
AVG = "Avg."
LAB_MACRO = "lab macro EM"


def paper_em(answer: str | None, golds: Iterable[str]) -> float:
    """1.0 when the officially read answer matches a gold answer, else 0.0."""
    return float(exact_match(official_answer(answer), tuple(golds)))


def paper_em_metrics(trajs) -> dict[str, float]:
    """``eval/paper_em/*`` over trajectories (scored: ``answer`` set); {} without a benchmark."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_source[t.example.data_source].append(paper_em(t.answer, t.example.golden_answers))
    present = [s for s, _ in BENCHMARKS if by_source.get(s)]
    if not present:
        return {}
    out = {f"{PREFIX}{s}": sum(by_source[s]) / len(by_source[s]) for s in present}
    out[f"{PREFIX}avg"] = sum(out[f"{PREFIX}{s}"] for s in present) / len(present)
    out[f"{PREFIX}benchmarks"] = float(len(present))
    return out


def table_row(metrics: Mapping[str, float]) -> dict[str, float]:
    """One row in the Table 2 layout from a metrics dict (NaN where a benchmark is missing)."""
    row = {title: float(metrics.get(f"{PREFIX}{s}", math.nan)) for s, title in BENCHMARKS}
    row[AVG] = float(metrics.get(f"{PREFIX}avg", math.nan))
    row[LAB_MACRO] = float(metrics.get("eval/em/macro", math.nan))
    return row


def has_paper_metrics(metrics: Mapping[str, float]) -> bool:
    return any(str(k).startswith(PREFIX) for k in metrics)


def format_row(row: Mapping[str, float]) -> str:
    """A two-line fixed-width table (header, values to 3 decimals, ``-`` when missing)."""
    names = list(row)
    cells = ["-" if math.isnan(row[n]) else f"{row[n]:.3f}" for n in names]
    widths = [max(len(n), len(c)) for n, c in zip(names, cells)]
    header = "  ".join(n.rjust(w) for n, w in zip(names, widths))
    values = "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    return f"{header}\n{values}"


def format_paper_table(metrics: Mapping[str, float]) -> str:
    """The titled table for a run's eval metrics ('' when it has no paper benchmark)."""
    if not has_paper_metrics(metrics):
        return ""
    n = int(metrics.get(f"{PREFIX}benchmarks", 0))
    note = "" if n == len(BENCHMARKS) else f"; Avg. over the {n} benchmarks present"
    title = f"Search-R1 Table 2 layout (EM, official answer extraction{note})"
    return f"{title}\n{format_row(table_row(metrics))}"
