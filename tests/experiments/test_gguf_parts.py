"""The GGUF's carry to the device: parts sized to what each call leaves beside the checkout,
checked on arrival, joined only when whole."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from tests.helpers.scripts import load_script

MiB = 2**20


def _parts():
    return load_script("experiments/paper_findings/gguf_parts.py")


def test_the_fewest_parts_fit_each_call_beside_the_tree():
    gp = _parts()
    total, tree, extra = 98 * MiB, 16 * MiB, 8 * MiB
    sizes = gp.part_sizes(total, tree, extra)
    assert sum(sizes) == total
    assert sizes[0] + tree + extra + gp.MARGIN <= gp.CALL_LIMIT
    assert all(s + tree + gp.MARGIN <= gp.CALL_LIMIT for s in sizes[1:])
    assert len(sizes) == 3  # 39 + 47 + 12 MiB: two parts cannot hold 98 MiB beside a 16 MiB tree
    assert len(gp.part_sizes(total, 30 * MiB, extra)) == 4  # a grown tree takes one call more
    with pytest.raises(gp.PartsError, match="no room"):
        gp.part_sizes(total, 60 * MiB, extra)


def test_split_then_take_rebuilds_the_model_only_when_every_part_arrived(tmp_path):
    gp = _parts()
    model = tmp_path / "Model.Q4.gguf"
    model.write_bytes(random.Random(3).randbytes(5 * MiB + 123))
    extra = tmp_path / ".whl"
    extra.mkdir()
    (extra / "w.whl").write_bytes(b"x" * MiB)
    out = tmp_path / ".mdl"
    calls = gp.split(model, out, tree=1 * MiB, first=[extra], limit=5 * MiB)
    manifest = json.loads((out / gp.MANIFEST).read_text())
    assert [len(c) for c in calls] == [3] + [2] * (len(calls) - 1) and len(calls) == len(manifest["parts"]) >= 3
    assert all(f"{out}/{gp.MANIFEST}" in c for c in calls)
    store, site = tmp_path / "store", tmp_path / "site"
    for i, carry in enumerate(calls):  # one device call each: only that call's part is present
        carried = tmp_path / f"call{i}"
        carried.mkdir()
        for path in carry[:2]:
            (carried / Path(path).name).write_bytes(Path(path).read_bytes())
        got = gp.take(carried, store, site)
        if i < len(calls) - 1:
            assert got is None and not (site / gp.PACKAGE / model.name).exists()
    assert got == site / gp.PACKAGE / model.name
    assert got.read_bytes() == model.read_bytes() and (site / gp.PACKAGE / "__init__.py").is_file()


def test_a_damaged_part_is_refused_and_require_waits_for_the_rest(tmp_path):
    gp = _parts()
    model = tmp_path / "m.gguf"
    model.write_bytes(random.Random(4).randbytes(3 * MiB))
    out = tmp_path / ".mdl"
    gp.split(model, out, tree=0, first=[], limit=2 * MiB)
    store = tmp_path / "store"
    args = ["take", "--dir", str(out), "--store", str(store), "--site", str(tmp_path / "site")]
    part = out / "gguf_01"
    good = part.read_bytes()
    part.unlink()
    assert gp.main([*args, "--require"]) == 3  # gguf_01 not carried yet
    part.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert gp.main(args) == 2
    part.write_bytes(good)
    assert gp.main([*args, "--require"]) == 0
    assert (tmp_path / "site" / gp.PACKAGE / "m.gguf").read_bytes() == model.read_bytes()


def test_the_tree_counts_tracked_and_untracked_files_but_not_ignored_ones(tmp_path):
    gp = _parts()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("big/\n")
    (tmp_path / "a.txt").write_bytes(b"a" * 100)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "x").write_bytes(b"x" * 10_000)
    subprocess.run(["git", "add", "a.txt", ".gitignore"], cwd=tmp_path, check=True)
    (tmp_path / "new.txt").write_bytes(b"n" * 50)
    # three files of under one block each, counted in whole 4 KiB blocks as the device counts
    assert gp.tree_bytes(tmp_path) == 3 * gp.BLOCK
    (tmp_path / "a.txt").write_bytes(b"a" * (gp.BLOCK + 1))
    assert gp.tree_bytes(tmp_path) == 4 * gp.BLOCK
