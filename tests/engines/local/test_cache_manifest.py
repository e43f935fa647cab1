"""The de-quantised model cache is verified on load and rebuilt when damaged."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from searchr1.engines.local import model as model_mod
from searchr1.engines.local.cache_manifest import MANIFEST, manifest_problem
from searchr1.engines.local.config import ModelConfig


@pytest.fixture
def fake_gguf(tmp_path, tiny_model_dir, monkeypatch):
    """A model config whose 'GGUF conversion' copies the tiny saved model; counts conversions."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny.gguf").write_bytes(b"GGUF fake")
    conversions: list[Path] = []

    def convert(cfg, out_dir: Path) -> None:
        conversions.append(out_dir)
        for f in tiny_model_dir.iterdir():
            shutil.copy(f, out_dir / f.name)

    monkeypatch.setattr(model_mod, "_convert_gguf", convert)
    cfg = ModelConfig(name="tiny", hf_id=str(src), gguf_file="tiny.gguf")
    return cfg, tmp_path / "cache", conversions


def _weights(folder: Path) -> Path:
    return next(folder.glob("*.safetensors"))


def test_cache_records_sizes_and_hashes_and_is_reused(fake_gguf):
    cfg, cache_dir, conversions = fake_gguf
    path = model_mod.ensure_gguf_cache(cfg, cache_dir)
    manifest = json.loads((path / MANIFEST).read_text())["files"]
    weights = _weights(path)
    assert manifest[weights.name]["size"] == weights.stat().st_size
    assert len(manifest[weights.name]["sha256"]) == 64 and "config.json" in manifest
    assert model_mod.ensure_gguf_cache(cfg, cache_dir) == path and len(conversions) == 1


def test_truncated_weights_are_rebuilt_and_load(fake_gguf):
    cfg, cache_dir, conversions = fake_gguf
    path = model_mod.ensure_gguf_cache(cfg, cache_dir)
    weights = _weights(path)
    good = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(good // 2)
    assert "bytes, expected" in manifest_problem(path)
    model = model_mod.load_model(cfg, "cpu", "float32", cache_dir)  # no traceback: rebuilt
    assert len(conversions) == 2 and _weights(path).stat().st_size == good
    assert manifest_problem(path) is None
    assert isinstance(model(torch.tensor([[3, 4, 5]])).logits, torch.Tensor)
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".")]  # no leftovers


def test_same_size_corruption_is_caught_by_the_hash(fake_gguf):
    cfg, cache_dir, conversions = fake_gguf
    path = model_mod.ensure_gguf_cache(cfg, cache_dir)
    weights = _weights(path)
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # same size, different bytes, newer mtime than the manifest
    weights.write_bytes(bytes(data))
    stat = (path / MANIFEST).stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert "sha256" in manifest_problem(path)
    model_mod.ensure_gguf_cache(cfg, cache_dir)
    assert len(conversions) == 2 and manifest_problem(path) is None


def test_cache_without_manifest_or_with_a_missing_file_is_rebuilt(fake_gguf):
    cfg, cache_dir, conversions = fake_gguf
    path = model_mod.ensure_gguf_cache(cfg, cache_dir)
    (path / "config.json").unlink()
    assert manifest_problem(path) == "config.json is missing"
    model_mod.ensure_gguf_cache(cfg, cache_dir)
    (path / MANIFEST).unlink()  # a cache written before manifests existed
    model_mod.ensure_gguf_cache(cfg, cache_dir)
    assert len(conversions) == 3 and manifest_problem(path) is None
