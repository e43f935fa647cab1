"""Trajectory report: escaping and self-containment in Python, filters in headless Chromium.

The browser tests drive the Debian ``chromium`` binary directly (``--dump-dom`` and
``--screenshot``), with the filter state in the URL hash; they install nothing and are
skipped when chromium is absent (``apt-get install -y chromium``).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from searchr1.analysis.report import embed_json, is_correct, main, render_html, write_report

HOSTILE_Q = 'Who wrote <script>alert(1)</script> "</script>" & <information>?'


def _turn(action: str, text: str, query=None, answer=None, docs=(), observation="") -> dict:
    return {"text": text, "action": action, "query": query, "answer": answer,
            "action_error": None, "stop_reason": "stop", "observation": observation,
            "documents": list(docs), "tool_error": None}


def _record(qid, source, correct, searches, question="Q?", group_index=0) -> dict:
    doc = {"id": "p1", "title": "Arvel", "text": "founded by </details><b>Mira</b>",
           "score": 3.2, "url": None, "source": None}
    turns = [_turn("search", f"<search>q{i}</search>", query=f"q{i}", docs=[doc],
                   observation="\n\n<information>Doc 1(Title: Arvel) x</information>\n\n")
             for i in range(searches)]
    turns.append(_turn("answer", "<answer>A</answer><img src=x onerror=alert(3)>", answer="A"))
    return {"id": qid, "question": question, "golden_answers": ["A" if correct else "B"],
            "data_source": source, "group_index": group_index, "answer": "A",
            "reward": 1.0 if correct else 0.0, "scores": {"em": 1.0 if correct else 0.0},
            "end_reason": "answer", "num_searches": searches, "num_tokens": 100, "turns": turns}


RECORDS = [
    _record("q1", "world_1hop", True, 1),
    _record("q1", "world_1hop", False, 2, group_index=1),
    _record("q2", "world_1hop", False, 0),
    _record("q3", "world_2hop", False, 0, question=HOSTILE_Q),
    _record("q4", "world_2hop", False, 2),
    _record("q5", "world_2hop", True, 2),
    _record("q6", "nq", False, 1),
]
# (hash, expected visible count)
FILTER_CASES = [
    ("", 7),
    ("#outcome=wrong&source=world_2hop", 2),
    ("#outcome=no-search", 2),
    ("#outcome=correct", 2),
    ("#source=nq", 1),
    ("#q=alert(1)", 1),
    ("#source=unknown_source", 0),
]


@pytest.fixture
def report(tmp_path) -> Path:
    path = tmp_path / "run" / "eval" / "step_2" / "trajectories.jsonl"
    path.parent.mkdir(parents=True)
    lines = [json.dumps(r) for r in RECORDS] + ['{"id": "cut short']
    path.write_text("\n".join(lines) + "\n")
    return write_report(path)


def test_report_is_self_contained_and_escaped(report):
    assert report.name == "trajectories.html" and report.parent.name == "step_2"
    page = report.read_text()
    assert "<script>alert" not in page and "</script>\"" not in page
    assert "<img src=x" not in page and "<information>" not in page
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=\"http|@import|url\(", page)
    data = page.split('<script id="trajectory-data" type="application/json">')[1].split("</script>")[0]
    rows = json.loads(data)
    assert len(rows) == 7 and HOSTILE_Q in [r["question"] for r in rows]
    for control in ('id="filter-source"', 'id="filter-outcome"', 'id="visible-count"'):
        assert control in page
    assert "<option value=\"world_2hop\">world_2hop</option>" in page


def test_embed_json_cannot_break_out():
    text = embed_json({"x": "</script><!-- & \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"x": "</script><!-- & \u2028"}


def test_outcome_rules_and_cli(tmp_path, report, capsys):
    assert is_correct({"scores": {"em": 1.0}, "reward": -0.1})
    assert not is_correct({"scores": {"em": 0.0}, "reward": 1.0})
    assert is_correct({"scores": {}, "reward": 1.0}) and not is_correct({"reward": 0.2})
    assert "0 of" not in render_html([], "empty")
    assert main([str(report.parents[2])]) == 0
    assert capsys.readouterr().out.strip() == str(report)


# ---------------------------------------------------------------- headless Chromium

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs the Debian 'chromium' package (apt-get install -y chromium)")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
           "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@needs_chromium
def test_filters_from_url_hash_in_headless_chromium(report, tmp_path):
    for fragment, expected in FILTER_CASES:
        proc = _chromium(tmp_path / "profile", "--dump-dom", report.as_uri() + fragment)
        assert proc.returncode == 0, proc.stderr[-2000:]
        match = re.search(r'id="visible-count">(\d+)<', proc.stdout)
        assert match, proc.stdout[:2000]
        assert int(match.group(1)) == expected, fragment
        shown = len(re.findall(r'<details class="traj [a-z]+"(?! hidden)', proc.stdout))
        assert shown == expected, fragment


@needs_chromium
def test_expanded_turns_render_as_text_in_chromium(report, tmp_path):
    proc = _chromium(tmp_path / "profile", "--dump-dom",
                     report.as_uri() + "#source=world_2hop&expand=all")
    dom = proc.stdout
    assert "&lt;img src=x onerror=alert(3)&gt;" in dom and "<img" not in dom
    assert "&lt;information&gt;Doc 1(Title: Arvel)" in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert dom.count('<details class="passage">') == 4  # 2 searches × 1 doc, in 2 rows
    assert "founded by &lt;/details&gt;&lt;b&gt;Mira&lt;/b&gt;" in dom


@needs_chromium
def test_screenshot_is_a_png_of_the_window_size(report, tmp_path):
    shot = tmp_path / "shot.png"
    proc = _chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,900",
                     report.as_uri() + "#expand=all")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert struct.unpack(">II", data[16:24]) == (1200, 900)
