"""A run folder that cannot be made is named for what is in its way, before Hydra runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from searchr1.startup.writable import writable_problem

ROOT = Path(__file__).resolve().parents[2]


def test_a_dangling_symlink_is_named_as_one(tmp_path):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    for folder in (link, link / "deeper" / "run"):
        problem = writable_problem("hydra.run.dir", folder)
        assert problem == (f"hydra.run.dir {folder} cannot be created: {link} is a symbolic link "
                           f"to {tmp_path / 'gone'}, which does not exist (create that folder, "
                           f"or remove the link)")
    (tmp_path / "gone").mkdir()  # the target made: the link is a folder like any other
    assert writable_problem("hydra.run.dir", link / "run") is None


def test_main_refuses_a_dangling_symlink_run_dir_in_one_paragraph(tmp_path):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "missing-disk")
    cmd = [sys.executable, "-m", "searchr1.main", f"hydra.run.dir={link}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "symbolic link" in out.stderr and "missing-disk" in out.stderr
    assert "File exists" not in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0
