"""data=nq_hotpotqa on small parquet files written here in the Search-R1 schema.

The files carry all 8 columns with the real types (list columns, nested structs), so pandas
hands the loader numpy arrays and dicts exactly as it does for the published files. The
modelscope source is exercised against a local HTTP server serving the parquet bytes.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchr1.data import DATASETS
from searchr1.data.nq_hotpotqa import (
    DataFileError,
    NqHotpotqaConfig,
    load_nq_hotpotqa,
    modelscope_url,
    read_examples,
    select_dev,
)

SOURCES = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]

SCHEMA = pa.schema([
    ("id", pa.string()),
    ("question", pa.string()),
    ("golden_answers", pa.list_(pa.string())),
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([
        ("ground_truth", pa.struct([("target", pa.list_(pa.string()))])),
        ("style", pa.string()),
    ])),
    ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
])


def row(i: int, source: str, split: str, answers: list[str] | None = None) -> dict:
    answers = answers if answers is not None else [f"answer {i}", f"alias {i}"]
    question = f"{source} question {i}?"
    return {
        "id": f"{split}_{i}", "question": question, "golden_answers": answers,
        "data_source": source,
        "prompt": [{"content": f"Answer the given question. Question: {question}", "role": "user"}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": [f"answer {i}", f"alias {i}"]},
                         "style": "rule"},
        "extra_info": {"index": i, "split": split},
    }


def write(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    """train: 30 nq then 20 hotpotqa; test: 15 rows per source (7 sources)."""
    train = [row(i, "nq", "train") for i in range(30)]
    train += [row(i, "hotpotqa", "train") for i in range(30, 50)]
    test = [row(15 * k + j, s, "test") for k, s in enumerate(SOURCES) for j in range(15)]
    write(tmp_path / "train.parquet", train)
    write(tmp_path / "test.parquet", test)
    return tmp_path


def cfg_for(data_dir: Path, **kw) -> NqHotpotqaConfig:
    return NqHotpotqaConfig(source="local", local_dir=str(data_dir), **kw)


def test_rows_map_to_examples_with_tuples_of_str(data_dir):
    examples = read_examples(data_dir / "train.parquet")
    assert len(examples) == 50
    ex = examples[0]
    assert (ex.id, ex.question, ex.data_source) == ("train_0", "nq question 0?", "nq")
    assert ex.golden_answers == ("answer 0", "alias 0")
    assert type(ex.golden_answers) is tuple and all(type(a) is str for a in ex.golden_answers)


def test_missing_golden_answers_fall_back_to_reward_target(tmp_path):
    rows = [row(0, "nq", "test", answers=[]), row(1, "nq", "test")]
    rows[1]["golden_answers"] = None
    examples = read_examples(write(tmp_path / "t.parquet", rows))
    assert [e.golden_answers for e in examples] == [("answer 0", "alias 0"),
                                                    ("answer 1", "alias 1")]


def test_golden_answers_column_absent_uses_reward_target(tmp_path):
    table = pa.Table.from_pylist([row(3, "nq", "test")], schema=SCHEMA)
    table = table.drop_columns(["golden_answers"])
    pq.write_table(table, tmp_path / "t.parquet")
    assert read_examples(tmp_path / "t.parquet")[0].golden_answers == ("answer 3", "alias 3")


def test_repeated_ids_are_qualified_by_source(tmp_path):
    rows = [row(0, "nq", "test"), row(0, "triviaqa", "test")]
    ids = [e.id for e in read_examples(write(tmp_path / "t.parquet", rows))]
    assert ids == ["nq/test_0", "triviaqa/test_0"]


def test_dev_is_k_per_source_seeded_and_disjoint(data_dir):
    ds = load_nq_hotpotqa(cfg_for(data_dir))
    counts = {s: sum(e.data_source == s for e in ds.dev) for s in SOURCES}
    assert counts == {s: 10 for s in SOURCES} and len(ds.dev) == 70
    assert len(ds.test) == 7 * 15 - 70
    dev_ids, test_ids, train_ids = ({e.id for e in split} for split in (ds.dev, ds.test, ds.train))
    assert not dev_ids & test_ids and not dev_ids & train_ids
    assert ds.corpus is None
    again = load_nq_hotpotqa(cfg_for(data_dir))
    assert [e.id for e in again.dev] == [e.id for e in ds.dev]
    other = load_nq_hotpotqa(cfg_for(data_dir, dev_seed=7))
    assert [e.id for e in other.dev] != [e.id for e in ds.dev]


def test_dev_follows_the_documented_rule(data_dir):
    examples = read_examples(data_dir / "test.parquet")
    dev, rest = select_dev(examples, 3, seed=42)
    rng = np.random.default_rng(42)
    expected = set()
    for source in sorted(SOURCES):
        rows = [i for i, e in enumerate(examples) if e.data_source == source]
        expected |= {rows[int(j)] for j in rng.choice(len(rows), size=3, replace=False)}
    assert [e.id for e in dev] == [examples[i].id for i in sorted(expected)]
    assert len(rest) == len(examples) - len(dev)


def test_small_source_gives_all_its_rows(tmp_path):
    rows = [row(i, "nq", "test") for i in range(20)]
    rows += [row(20 + i, "bamboogle", "test") for i in range(4)]
    dev, _ = select_dev(read_examples(write(tmp_path / "t.parquet", rows)), 10, seed=42)
    assert sum(e.data_source == "bamboogle" for e in dev) == 4


def test_max_train_is_a_seeded_subset_in_file_order(data_dir):
    ds = load_nq_hotpotqa(cfg_for(data_dir, max_train=10))
    full = [e.id for e in read_examples(data_dir / "train.parquet")]
    ids = [e.id for e in ds.train]
    assert len(ids) == 10 and ids == sorted(ids, key=full.index)
    assert {e.data_source for e in ds.train} == {"nq", "hotpotqa"}  # not just a prefix


def test_registered_loader(data_dir):
    ds = DATASETS.get("nq_hotpotqa")(cfg_for(data_dir))
    assert len(ds.train) == 50


def test_missing_file_is_a_clear_error(data_dir):
    (data_dir / "test.parquet").unlink()
    with pytest.raises(DataFileError, match=r"test\.parquet not found.*local_dir"):
        load_nq_hotpotqa(cfg_for(data_dir))


def test_local_needs_local_dir():
    with pytest.raises(ValueError, match="local_dir"):
        load_nq_hotpotqa(NqHotpotqaConfig(source="local"))


def test_unknown_source_is_refused_by_the_schema():
    from omegaconf import OmegaConf

    from searchr1.utils.schema import schema_problems

    cfg = OmegaConf.create({"data": OmegaConf.structured(NqHotpotqaConfig(source="s3"))})
    assert schema_problems(cfg) == ["data.source='s3' is unknown (valid: hf, local, modelscope)"]


def test_modelscope_url_pattern(monkeypatch):
    monkeypatch.delenv("MODELSCOPE_DOMAIN", raising=False)
    url = modelscope_url("lab/nq_hotpotqa_train", "test.parquet")
    assert url == ("https://www.modelscope.cn/api/v1/datasets/lab/nq_hotpotqa_train/repo?"
                   "Source=SDK&Revision=master&FilePath=test.parquet")
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "modelscope.ai")
    assert modelscope_url("a/b", "x").startswith("https://modelscope.ai/api/v1/datasets/a/b/repo?")


def test_modelscope_downloads_over_http(data_dir, tmp_path, httpserver, monkeypatch):
    for name in ("train.parquet", "test.parquet"):
        httpserver.expect_request(
            "/api/v1/datasets/lab/nq_hotpotqa_train/repo",
            query_string={"Source": "SDK", "Revision": "master", "FilePath": name},
        ).respond_with_data((data_dir / name).read_bytes(), content_type="application/octet-stream")
    monkeypatch.setenv("MODELSCOPE_DOMAIN", httpserver.url_for("/").rstrip("/"))
    cfg = NqHotpotqaConfig(source="modelscope", modelscope_repo="lab/nq_hotpotqa_train",
                           cache_dir=str(tmp_path / "cache"))
    ds = load_nq_hotpotqa(cfg)
    assert len(ds.train) == 50 and len(ds.dev) == 70
    cached = tmp_path / "cache" / "modelscope" / "lab" / "nq_hotpotqa_train"
    assert sorted(p.name for p in cached.iterdir()) == ["test.parquet", "train.parquet"]
    served = len(httpserver.log)
    load_nq_hotpotqa(cfg)  # second load: from the cache, no request
    assert len(httpserver.log) == served == 2
    queries = [urllib.parse.urlsplit(req.url).query for req, _ in httpserver.log]
    assert all("Source=SDK" in q for q in queries)


def test_modelscope_http_error_is_clear(httpserver, tmp_path, monkeypatch):
    httpserver.expect_request("/api/v1/datasets/lab/missing/repo").respond_with_data(
        "no", status=404)
    monkeypatch.setenv("MODELSCOPE_DOMAIN", httpserver.url_for("/").rstrip("/"))
    cfg = NqHotpotqaConfig(source="modelscope", modelscope_repo="lab/missing",
                           cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataFileError, match="HTTP 404"):
        load_nq_hotpotqa(cfg)
    assert not list((tmp_path / "cache").rglob("*.parquet"))  # no half file left behind


def test_hf_source_downloads_both_files_from_the_dataset_repo(data_dir, monkeypatch):
    """The hub call itself is the network boundary: record its arguments, serve local files."""
    import huggingface_hub

    calls = []

    def fake_download(repo_id, filename, repo_type, cache_dir):
        calls.append((repo_id, filename, repo_type, cache_dir))
        return str(data_dir / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    ds = load_nq_hotpotqa(NqHotpotqaConfig(cache_dir="/c"))
    assert calls == [("PeterJinGo/nq_hotpotqa_train", f, "dataset", "/c")
                     for f in ("train.parquet", "test.parquet")]
    assert len(ds.dev) == 70
