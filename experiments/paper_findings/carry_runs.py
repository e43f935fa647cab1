"""Carry a study's unfinished arms to another machine (or session), so they resume there.

    python experiments/paper_findings/carry_runs.py pack STUDY OUT [--budget-mb 60] [--max-files 7]
    python experiments/paper_findings/carry_runs.py unpack DIR STUDY
    python experiments/paper_findings/carry_runs.py plan DIR [--max-mb 48]

``pack`` writes, for unfinished arms with a complete checkpoint, ``resume_<arm>-step<N>.tgz``:
the run's logs, config, metrics and eval summaries, its newest checkpoint only (the loop's
folder, the engine state and the sampler weights it names) and ``manifest.json``, the sha256
of every file. Large files are stored once by content: the sampler's adapters equal the
engine state's, and the frozen KL reference is the same in every arm of one warm start, so
a file used by two arms is written once as ``blob_<sha16>.gz`` beside the archives. Any
output over ``--max-mb`` (the device's 16 MiB per returned file) is split into ``.partNN``
files. Arms are taken oldest-carried first until ``--budget-mb`` or ``--max-files`` is
reached (the device returns at most 64 MiB and 8 files per call, ``study.tgz`` included);
``STUDY/.carried.json`` remembers what was carried at which step, so successive packs take
turns and never send a checkpoint or a blob twice.

``unpack`` takes a folder holding what several packs returned (copy every call's ``resume_*``
and ``blob_*`` there), picks each arm's newest step, joins the parts, checks every file
against the manifest and writes the arm into STUDY, where ``trainer.resume=auto`` continues
from that checkpoint. ``plan`` groups a folder's files into carries of at most ``--max-mb``
(the device's 64 MiB per call, less the checkout's size), one line of paths per call.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import sys
import tarfile
from collections import Counter
from pathlib import Path

from searchr1.loop.checkpoint import checkpoint_dir, newest_state

SKIPPED_NAMES = {"trajectories.jsonl", "checkpoints", "wandb", "swanlog", ".searchr1.lock"}
MANIFEST = "manifest.json"
RECORD = ".carried.json"
BLOB_MIN_BYTES = 1 << 20  # files this large are stored by content (dedup across arms)
MiB = 1 << 20
_ARCHIVE = re.compile(r"^resume_(?P<arm>.+)-step(?P<step>\d+)\.tgz$")
_PART = re.compile(r"^(?P<name>.+)\.part(?P<index>\d{2})$")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_files(run: Path) -> list[Path]:
    """The files of ``run`` to carry (paths relative to its parent), newest checkpoint only."""
    state = newest_state(run)
    if state is None:
        return []
    keep = [p for p in run.rglob("*") if p.is_file()
            and not SKIPPED_NAMES.intersection(p.relative_to(run).parts)
            and not p.name.endswith(".html")]
    for root in (checkpoint_dir(run, state.step), Path(state.engine_state), Path(state.sampler_weights)):
        keep += [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else [root]
    return sorted({p.relative_to(run.parent) for p in keep})


def _split(path: Path, max_bytes: int) -> list[Path]:
    """Replace ``path`` by ``.partNN`` pieces of at most ``max_bytes`` when it is larger."""
    if path.stat().st_size <= max_bytes:
        return [path]
    data, parts = path.read_bytes(), []
    for i in range(0, len(data), max_bytes):
        part = path.with_name(f"{path.name}.part{i // max_bytes:02d}")
        part.write_bytes(data[i:i + max_bytes])
        parts.append(part)
    path.unlink()
    return parts


def _arm_archive(study: Path, run: Path, step: int, files: list[Path], blobs: dict[str, str],
                 shared: set[str], out: Path) -> Path:
    """``resume_<arm>-step<N>.tgz``: small files by path, large ones once each under blobs/."""
    manifest = {"arm": run.name, "step": step, "files": {}, "blobs": {}}
    target = out / f"resume_{run.name}-step{step}.tgz"
    with tarfile.open(target, "w:gz") as tar:
        stored: set[str] = set()
        for rel in files:
            digest = blobs[rel.as_posix()]
            manifest["files"][rel.as_posix()] = digest
            if (study / rel).stat().st_size < BLOB_MIN_BYTES:
                tar.add(study / rel, arcname=rel.as_posix())
                continue
            manifest["blobs"][rel.as_posix()] = digest
            if digest not in shared and digest not in stored:
                tar.add(study / rel, arcname=f"blobs/{digest}")
                stored.add(digest)
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return target


def pack(study: Path, out: Path, budget_bytes: int = 60 * MiB, max_files: int = 7,
         max_file_bytes: int = 16 * MiB) -> list[Path]:
    """Archive unfinished arms, oldest-carried first, within the budget; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    record_path = study / RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"arms": {}, "blobs": []}
    arms = []
    for run in sorted(p for p in study.iterdir() if p.is_dir() and (p / "metrics.jsonl").is_file()):
        if (run / "summary.json").is_file():
            continue
        state = newest_state(run)
        if state is None:
            print(f"{run.name}: no complete checkpoint, it restarts from step 0", file=sys.stderr)
            continue
        if record["arms"].get(run.name, -1) >= state.step:
            print(f"{run.name}: step {state.step} was carried already")
            continue
        files = run_files(run)
        arms.append((record["arms"].get(run.name, -1), run, state.step, files,
                     {rel.as_posix(): sha256(study / rel) for rel in files}))
    arms.sort(key=lambda a: (a[0], a[1].name))  # never carried first, then the oldest carry
    users = Counter(d for *_, digests in arms for d in set(digests.values()))
    sizes = {d: (study / rel).stat().st_size for *_, digests in arms for rel, d in digests.items()}
    # a large file two arms use, or one an earlier pack sent as a blob, travels as a blob file
    shared = {d for d, n in users.items() if (n > 1 or d in record["blobs"]) and sizes[d] >= BLOB_MIN_BYTES}
    written: list[Path] = []
    used_bytes = 0
    for _, run, step, files, digests in arms:
        try:
            pieces = [_arm_archive(study, run, step, files, digests, shared, out)]
        except OSError as err:  # the running arm replaced that checkpoint meanwhile
            print(f"{run.name}: step {step} changed while packing ({err}); the next pack takes it",
                  file=sys.stderr)
            continue
        new_blobs = sorted({d for d in digests.values() if d in shared} - set(record["blobs"]))
        for digest in new_blobs:
            rel = next(r for r, d in digests.items() if d == digest)
            blob = out / f"blob_{digest[:16]}.gz"
            blob.write_bytes(gzip.compress((study / rel).read_bytes(), mtime=0))
            pieces.append(blob)
        pieces = [p for piece in pieces for p in _split(piece, max_file_bytes)]
        size = sum(p.stat().st_size for p in pieces)
        if used_bytes + size > budget_bytes or len(written) + len(pieces) > max_files:
            for p in pieces:
                p.unlink()
            why = "alone over the budget" if not written else "no room left in this pack"
            print(f"{run.name}: {size / MiB:.1f} MB in {len(pieces)} files, {why}; the next pack takes it",
                  file=sys.stderr)
            if not written and (size > budget_bytes or len(pieces) > max_files):
                raise SystemExit(f"{run.name}: its resume files ({size / MiB:.1f} MB, {len(pieces)} files) "
                                 f"exceed one pack ({budget_bytes / MiB:.0f} MB, {max_files} files)")
            continue
        used_bytes += size
        written += pieces
        record["arms"][run.name] = step
        record["blobs"] = sorted(set(record["blobs"]) | set(new_blobs))
        print(f"{run.name}: step {step}, {size / MiB:.1f} MB in {len(pieces)} files")
    record_path.write_text(json.dumps(record, indent=1))
    return written


def _joined(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` by name, with ``.partNN`` pieces joined in order."""
    parts: dict[str, list[tuple[int, Path]]] = {}
    whole: dict[str, bytes] = {}
    for p in sorted(folder.iterdir()):
        if not p.is_file():
            continue
        m = _PART.match(p.name)
        if m:
            parts.setdefault(m["name"], []).append((int(m["index"]), p))
        else:
            whole[p.name] = p.read_bytes()
    for name, pieces in parts.items():
        indices = sorted(i for i, _ in pieces)
        if indices != list(range(len(indices))):
            raise SystemExit(f"{folder}: {name} has parts {indices}; a part is missing")
        whole[name] = b"".join(p.read_bytes() for _, p in sorted(pieces))
    return whole


def unpack(folder: Path, study: Path) -> list[str]:
    """Write each arm's newest carried checkpoint from ``folder`` into ``study``; returns the arms."""
    files = _joined(folder)
    newest: dict[str, tuple[int, str]] = {}
    for name in files:
        m = _ARCHIVE.match(name)
        if m and int(m["step"]) > newest.get(m["arm"], (-1, ""))[0]:
            newest[m["arm"]] = (int(m["step"]), name)
    blobs = {name[5:-3]: name for name in files if name.startswith("blob_") and name.endswith(".gz")}
    record = {"arms": {}, "blobs": []}
    for arm, (step, name) in sorted(newest.items()):
        with tarfile.open(fileobj=io.BytesIO(files[name]), mode="r:gz") as tar:
            members = {m.name: m for m in tar.getmembers()}
            manifest = json.loads(tar.extractfile(members[MANIFEST]).read())  # type: ignore[union-attr]
            for rel, digest in manifest["files"].items():
                if rel in manifest["blobs"]:
                    if f"blobs/{digest}" in members:
                        data = tar.extractfile(members[f"blobs/{digest}"]).read()  # type: ignore[union-attr]
                    elif digest[:16] in blobs:
                        data = gzip.decompress(files[blobs[digest[:16]]])
                        record["blobs"].append(digest)
                    else:
                        raise SystemExit(f"{name}: {rel} needs blob_{digest[:16]}.gz, which is not in "
                                         f"{folder} (an earlier pack returned it)")
                else:
                    data = tar.extractfile(members[rel]).read()  # type: ignore[union-attr]
                if hashlib.sha256(data).hexdigest() != digest:
                    raise SystemExit(f"{name}: {rel} does not match its manifest (a corrupt or mixed part)")
                target = study / rel
                if Path(rel).is_absolute() or ".." in Path(rel).parts:
                    raise SystemExit(f"{name}: refusing the path {rel}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        record["arms"][arm] = step
        print(f"{arm}: resumes from step {step}")
    record["blobs"] = sorted(set(record["blobs"]))
    (study / RECORD).write_text(json.dumps(record, indent=1))
    return sorted(newest)


def plan(folder: Path, max_bytes: int) -> list[list[Path]]:
    """Group the folder's files (newest step per arm, with its blobs) into carries of ``max_bytes``."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    steps: dict[str, int] = {}
    for p in files:
        m = _ARCHIVE.match(_PART.sub(r"\g<name>", p.name))
        if m:
            steps[m["arm"]] = max(steps.get(m["arm"], -1), int(m["step"]))
    needed = []
    for p in files:
        m = _ARCHIVE.match(_PART.sub(r"\g<name>", p.name))
        if p.name.startswith("blob_") or (m and int(m["step"]) == steps[m["arm"]]):
            needed.append(p)
    calls: list[list[Path]] = [[]]
    for p in sorted(needed, key=lambda p: -p.stat().st_size):
        if sum(q.stat().st_size for q in calls[-1]) + p.stat().st_size > max_bytes or len(calls[-1]) == 8:
            calls.append([])
        calls[-1].append(p)
    return [c for c in calls if c]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack")
    p.add_argument("study", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--budget-mb", type=float, default=60.0)
    p.add_argument("--max-files", type=int, default=7)
    p.add_argument("--max-mb", type=float, default=16.0)
    u = sub.add_parser("unpack")
    u.add_argument("folder", type=Path)
    u.add_argument("study", type=Path)
    c = sub.add_parser("plan")
    c.add_argument("folder", type=Path)
    c.add_argument("--max-mb", type=float, default=48.0)
    args = parser.parse_args()
    if args.verb == "pack":
        pack(args.study, args.out, int(args.budget_mb * MiB), args.max_files, int(args.max_mb * MiB))
    elif args.verb == "unpack":
        args.study.mkdir(parents=True, exist_ok=True)
        unpack(args.folder, args.study)
    else:
        for i, call in enumerate(plan(args.folder, int(args.max_mb * MiB)), 1):
            print(f"call {i}: " + json.dumps([str(p) for p in call]))


if __name__ == "__main__":
    main()
