"""``data=nq_hotpotqa``: the Search-R1 training data (NQ + HotpotQA) and its 7-benchmark test set.

Files: ``train.parquet`` (169,615 questions) and ``test.parquet`` (51,713 over nq, triviaqa,
popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle) of the HF dataset
``PeterJinGo/nq_hotpotqa_train``, with columns ``id, question, golden_answers, data_source,
prompt, ability, reward_model{ground_truth{target}}, extra_info``. The ``prompt`` column (the
paper's rendered instruction, a list of chat messages) travels in ``QAExample.meta["prompt"]``
for ``protocol.prompt=dataset``; by default the protocol renders its own.

Sources (``source``):

- ``hf``: ``huggingface_hub.hf_hub_download`` of both files into the HF cache (or
  ``cache_dir``);
- ``local``: ``<local_dir>/train.parquet`` and ``<local_dir>/test.parquet``;
- ``modelscope``: the same files from a ModelScope *dataset* repo over its HTTP file API
  (the lab's mirror), ``GET {endpoint}/api/v1/datasets/{namespace}/{name}/repo?Source=SDK&
  Revision=master&FilePath=<file>``; ``endpoint`` is ``$MODELSCOPE_DOMAIN`` when set (as in
  the ModelScope SDK), else ``https://www.modelscope.cn``. Downloads land in
  ``<cache_dir>/modelscope/<namespace>/<name>/`` (default cache ``~/.cache/searchr1/datasets``),
  written atomically and reused on the next run.

Splits. ``dev`` is K questions per ``data_source`` of test.parquet (lab: 10 × 7 = 70, seed
42), chosen by this exact rule: one ``numpy.random.default_rng(dev_seed)``; visit the
sources in sorted name order; for each, ``rng.choice(n, size=min(K, n), replace=False)``
over that source's rows in file order; dev lists the picked rows in file order. ``test`` is
the *rest* of test.parquet, so dev and test never share a question (the lab's "full pool"
includes its dev questions; take dev ∪ test for that). With ``dev_per_source=0`` test is the
whole of test.parquet (the paper's eval: all 51,713 questions over the 7 sources).
``train`` is train.parquet, or, with
``max_train``, a seeded random subset of it kept in file order (a prefix would be NQ only:
the file lists all NQ rows before all HotpotQA rows). ``corpus`` is None: the lab searches
the web, the paper a wiki-18 index served over HTTP.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

from searchr1.data.types import Dataset, QAExample
from searchr1.utils.schema import one_of, ranged

FILES = ("train.parquet", "test.parquet")
MODELSCOPE_DEFAULT = "https://www.modelscope.cn"
MODELSCOPE_REVISION = "master"
DEFAULT_CACHE = "~/.cache/searchr1/datasets"
SOURCES = ("hf", "local", "modelscope")  # data.source: fetch_files has one fetcher each


@dataclass
class NqHotpotqaConfig:
    """Schema of ``data=nq_hotpotqa`` (module docstring: sources and split rules)."""

    name: str = "nq_hotpotqa"  # dataset name, used in logs and output paths
    source: str = one_of("hf", SOURCES)  # where the parquet files come from: hf | local | modelscope
    hf_repo: str = "PeterJinGo/nq_hotpotqa_train"  # HF dataset repo (source=hf)
    local_dir: str | None = None  # folder with train.parquet and test.parquet (source=local)
    modelscope_repo: str | None = None  # ModelScope dataset "namespace/name" (source=modelscope)
    cache_dir: str | None = None  # download cache; null = HF's (hf), ~/.cache/searchr1/datasets
    dev_per_source: int = ranged(10, ge=0)  # dev questions per data_source, drawn from test.parquet
    dev_seed: int = 42  # seed of the dev draw (and of the max_train subset)
    max_train: int | None = ranged(None, ge=1)  # keep a seeded random subset of this many train questions


class DataFileError(FileNotFoundError):
    """A parquet file that is missing or cannot be fetched; the message says which and why."""


# ---------------------------------------------------------------------------- fetching


def fetch_files(cfg: NqHotpotqaConfig) -> dict[str, Path]:
    """Local paths of ``train.parquet`` and ``test.parquet`` for ``cfg.source``."""
    fetchers = {"hf": _hf_files, "local": _local_files, "modelscope": _modelscope_files}
    return fetchers[cfg.source](cfg)  # one of SOURCES: the schema checked it


def _local_files(cfg: NqHotpotqaConfig) -> dict[str, Path]:
    if not cfg.local_dir:
        raise ValueError("data.source=local needs data.local_dir (a folder with "
                         "train.parquet and test.parquet)")
    root = Path(cfg.local_dir).expanduser()
    paths = {name: root / name for name in FILES}
    for name, path in paths.items():
        if not path.is_file():
            raise DataFileError(f"data=nq_hotpotqa: {path} not found; data.local_dir must hold "
                                f"{' and '.join(FILES)} (from the HF dataset {cfg.hf_repo})")
    return paths


def _hf_files(cfg: NqHotpotqaConfig) -> dict[str, Path]:
    """Both files through the HF hub cache (a cached copy is reused offline)."""
    from huggingface_hub import hf_hub_download

    out = {}
    for name in FILES:
        try:
            out[name] = Path(hf_hub_download(repo_id=cfg.hf_repo, filename=name,
                                             repo_type="dataset", cache_dir=cfg.cache_dir))
        except Exception as err:  # noqa: BLE001 - hub errors are many; one message for all
            raise DataFileError(f"data=nq_hotpotqa: cannot get {name} from HF dataset "
                                f"{cfg.hf_repo}: {err}; or use data.source=local") from err
    return out


def modelscope_url(repo: str, filename: str, endpoint: str | None = None,
                   revision: str = MODELSCOPE_REVISION) -> str:
    """The ModelScope HTTP file API URL of ``filename`` in dataset repo ``repo``."""
    if repo.count("/") != 1:
        raise ValueError(f"data.modelscope_repo must be 'namespace/name', got {repo!r}")
    base = (endpoint or os.environ.get("MODELSCOPE_DOMAIN") or MODELSCOPE_DEFAULT).rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = f"https://{base}"
    query = urlencode({"Source": "SDK", "Revision": revision, "FilePath": filename})
    return f"{base}/api/v1/datasets/{repo}/repo?{query}"


def _modelscope_files(cfg: NqHotpotqaConfig) -> dict[str, Path]:
    if not cfg.modelscope_repo:
        raise ValueError("data.source=modelscope needs data.modelscope_repo ('namespace/name')")
    root = Path(cfg.cache_dir or DEFAULT_CACHE).expanduser() / "modelscope" / cfg.modelscope_repo
    out = {}
    for name in FILES:
        out[name] = root / name
        if not out[name].is_file():
            download(modelscope_url(cfg.modelscope_repo, name), out[name])
    return out


def download(url: str, dest: Path, timeout: float = 60.0) -> None:
    """Stream ``url`` to ``dest`` through a temp file renamed into place (never half a file)."""
    import httpx

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, timeout=timeout,
                                                     follow_redirects=True) as resp:
            if resp.status_code != 200:
                raise DataFileError(f"data=nq_hotpotqa: GET {url} returned HTTP "
                                    f"{resp.status_code}")
            for chunk in resp.iter_bytes():
                out.write(chunk)
        os.replace(tmp, dest)
    except httpx.HTTPError as err:
        raise DataFileError(f"data=nq_hotpotqa: cannot download {url}: {err}") from err
    finally:
        Path(tmp).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- reading


def _strings(value) -> tuple[str, ...]:
    """A parquet cell (str, list, numpy array, None) as a tuple of strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, float) and np.isnan(value):
        return ()
    return tuple(str(v) for v in np.asarray(value, dtype=object).ravel())


def _answers(row: dict) -> tuple[str, ...]:
    """``golden_answers``, else ``reward_model.ground_truth.target``."""
    answers = _strings(row.get("golden_answers"))
    if answers:
        return answers
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    return _strings(truth.get("target") if isinstance(truth, dict) else None)


def read_examples(path: str | Path) -> list[QAExample]:
    """All rows of one Search-R1 parquet file as ``QAExample``s, in file order.

    Row ids are kept; when a file repeats an id (sources numbered independently) every id
    of that file becomes ``<data_source>/<id>``, and a row still clashing gets ``#<row>``.
    """
    import pandas as pd  # here, not at module top: composing a config should not load pandas

    frame = pd.read_parquet(path)
    missing = {"question", "data_source"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    rows = frame.to_dict(orient="records")
    ids = _unique_ids(rows)
    out = []
    for i, (row, id_) in enumerate(zip(rows, ids)):
        answers = _answers(row)
        if not answers:
            raise ValueError(f"{path}: row {i} ({id_}) has no golden_answers or reward target")
        out.append(QAExample(id=id_, question=str(row["question"]), golden_answers=answers,
                             data_source=str(row["data_source"]), meta=_meta(row)))
    return out


def _meta(row: dict) -> dict:
    """Extra fields a row carries: ``prompt`` as a list of ``{"role", "content"}`` messages."""
    prompt = row.get("prompt")
    if prompt is None or (isinstance(prompt, float) and np.isnan(prompt)):
        return {}
    if isinstance(prompt, str):
        return {"prompt": prompt}
    messages = np.asarray(prompt, dtype=object).ravel()
    return {"prompt": [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]}


def _unique_ids(rows: list[dict]) -> list[str]:
    """Row ids as strings, qualified as described in ``read_examples`` when they repeat."""
    ids = [str(r["id"]) if r.get("id") is not None else str(i) for i, r in enumerate(rows)]
    if len(set(ids)) == len(ids):
        return ids
    ids = [f"{r['data_source']}/{id_}" for r, id_ in zip(rows, ids)]
    seen: set[str] = set()
    out = []
    for i, id_ in enumerate(ids):
        out.append(id_ if id_ not in seen else f"{id_}#{i}")
        seen.add(out[-1])
    return out


# ------------------------------------------------------------------------------ splits


def select_dev(
    examples: list[QAExample], k: int, seed: int
) -> tuple[list[QAExample], list[QAExample]]:
    """(dev, rest): ``k`` per ``data_source`` by the rule in the module docstring."""
    by_source: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        by_source.setdefault(ex.data_source, []).append(i)
    rng = np.random.default_rng(seed)
    picked: set[int] = set()
    for source in sorted(by_source):
        rows = by_source[source]
        for j in rng.choice(len(rows), size=min(k, len(rows)), replace=False):
            picked.add(rows[int(j)])
    dev = [ex for i, ex in enumerate(examples) if i in picked]
    rest = [ex for i, ex in enumerate(examples) if i not in picked]
    return dev, rest


def subsample(examples: list[QAExample], n: int | None, seed: int) -> list[QAExample]:
    """``n`` examples drawn without replacement (seeded), kept in their original order."""
    if n is None or n >= len(examples):
        return examples
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), size=n, replace=False))
    return [examples[int(i)] for i in keep]


def load_nq_hotpotqa(cfg: NqHotpotqaConfig) -> Dataset:
    """Fetch (or find) both files and build the train / dev / test splits."""
    paths = fetch_files(cfg)
    train = subsample(read_examples(paths["train.parquet"]), cfg.max_train, cfg.dev_seed)
    dev, test = select_dev(read_examples(paths["test.parquet"]), cfg.dev_per_source, cfg.dev_seed)
    return Dataset(train=train, dev=dev, test=test, corpus=None)
