"""A self-contained HTML page to read the trajectories of one evaluation.

    python -m searchr1.analysis.trajectory_page outputs/…/eval/step_20/trajectories.jsonl   # or a run folder

``write_report`` writes ``trajectories.html`` beside the JSONL: one file, CSS and script
inline, the rows embedded as JSON, nothing fetched from the network, so it opens from a
laptop, a cluster's file browser or a CI artifact alike. The page lists every trajectory
(question, source, outcome, searches, reward); opening one shows it turn by turn: the
model's raw output, the query, each retrieved passage (collapsible), the observation,
then the final answer against the gold answers.

Filters: data source (``#filter-source``), outcome (``#filter-outcome``: all, correct,
wrong, no-search) and free text (``#filter-text``); ``#visible-count`` shows how many
rows match. The filter state lives in the URL hash (``#outcome=wrong&source=world_2hop``;
``expand=all`` opens every visible row), so a filtered view can be linked or bookmarked.

Model output is hostile text (it contains ``<information>`` tags, sometimes HTML): the
data travels as JSON with ``<``, ``>`` and ``&`` escaped, and the script inserts it with
``textContent`` only, never as markup.
"""

from __future__ import annotations

import argparse
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT_NAME = "trajectories.html"
ASSETS = Path(__file__).with_name("report_page")  # report_page.css, report_page.js
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                 "\u2029": "\\u2029"}


def read_records(path: Path) -> list[dict]:
    """Rows of a ``trajectories.jsonl`` (``Trajectory.to_record()``); bad lines skipped."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            records.append(row)
    return records


def is_correct(record: dict) -> bool:
    """Exact match if the scores carry ``em`` (or ``correct``); otherwise reward ≥ 1."""
    scores = record.get("scores") or {}
    for key in ("em", "correct"):
        if isinstance(scores.get(key), (int, float)):
            return scores[key] > 0.5
    return float(record.get("reward") or 0.0) >= 1.0


def prepare(records: Sequence[dict]) -> list[dict]:
    """Records sorted by source, question and sample, with the fields the filters use."""
    rows = []
    for index, record in enumerate(records):
        searches = record.get("num_searches")
        if searches is None:
            searches = sum(1 for t in record.get("turns") or [] if t.get("action") == "search")
        rows.append({**record, "_index": index, "_correct": is_correct(record),
                     "_searches": int(searches), "_source": str(record.get("data_source") or "?")})
    rows.sort(key=lambda r: (r["_source"], str(r.get("id")), r.get("group_index") or 0))
    return rows


def embed_json(value: Any) -> str:
    """JSON that cannot close its ``<script>`` element or open a new tag."""
    text = json.dumps(value, ensure_ascii=False)
    for raw, escaped in _JSON_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def _source_table(rows: Sequence[dict]) -> str:
    """Static per-source table: count, EM, no-search rate, mean reward."""
    sources = sorted({r["_source"] for r in rows})
    lines = [("<table class='stats'><thead><tr><th>source</th><th>n</th><th>EM</th>"
              "<th>no search</th><th>mean reward</th></tr></thead><tbody>")]
    for source in [*sources, None]:
        part = [r for r in rows if source is None or r["_source"] == source]
        if not part:
            continue
        n = len(part)
        em = sum(r["_correct"] for r in part) / n
        nosearch = sum(r["_searches"] == 0 for r in part) / n
        reward = sum(float(r.get("reward") or 0.0) for r in part) / n
        name = html.escape(source) if source is not None else "<b>all</b>"
        lines.append(f"<tr><td>{name}</td><td>{n}</td><td>{em:.3f}</td><td>{nosearch:.3f}</td>"
                     f"<td>{reward:.3f}</td></tr>")
    lines.append("</tbody></table>")
    return "".join(lines)


def _asset(kind: str) -> str:
    """The page's stylesheet or script, kept as real ``.css``/``.js`` files beside this one."""
    return ASSETS.with_suffix(f".{kind}").read_text(encoding="utf-8")


def render_html(records: Sequence[dict], title: str) -> str:
    """The whole page as one string."""
    rows = prepare(records)
    sources = sorted({r["_source"] for r in rows})
    options = "".join(f"<option value=\"{html.escape(s, quote=True)}\">{html.escape(s)}</option>"
                      for s in sources)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_asset("css")}</style></head>
<body>
<header><h1>{html.escape(title)}</h1>{_source_table(rows)}</header>
<nav class="controls">
  <label>source <select id="filter-source"><option value="all">all</option>{options}</select></label>
  <label>outcome <select id="filter-outcome">
    <option value="all">all</option><option value="correct">correct</option>
    <option value="wrong">wrong</option><option value="no-search">no search</option>
  </select></label>
  <label>text <input id="filter-text" type="search" placeholder="question, answer, query…"></label>
  <span class="count"><span id="visible-count">{len(rows)}</span> of
    <span id="total-count">{len(rows)}</span> trajectories</span>
</nav>
<noscript><p>This report needs JavaScript to list trajectories.</p></noscript>
<main id="trajectory-list"></main>
<script id="trajectory-data" type="application/json">{embed_json(rows)}</script>
<script>{_asset("js")}</script>
</body></html>
"""


def write_report(trajectories_jsonl_path: str | Path) -> Path:
    """Write ``trajectories.html`` beside ``trajectories_jsonl_path``; return its path."""
    source = Path(trajectories_jsonl_path)
    folder = source.resolve().parent
    title = "trajectories — " + "/".join(p for p in folder.parts[-3:] if p != folder.anchor)
    out = source.with_name(REPORT_NAME)
    out.write_text(render_html(read_records(source), title), encoding="utf-8")
    return out


def find_trajectory_files(paths: Sequence[str | Path]) -> list[Path]:
    """JSONL files given directly, or every ``trajectories.jsonl`` below given folders."""
    found: list[Path] = []
    for path in map(Path, paths):
        found.extend(sorted(path.rglob("trajectories.jsonl")) if path.is_dir() else [path])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchr1.analysis.trajectory_page", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="trajectories.jsonl files or run folders")
    files = find_trajectory_files(parser.parse_args(argv).paths)
    for path in files:
        print(write_report(path))
    return 0 if files else 1


if __name__ == "__main__":
    raise SystemExit(main())
