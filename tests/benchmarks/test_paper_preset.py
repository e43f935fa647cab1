"""The paper preset as published (full fine-tuning) on a local Qwen-shaped folder, offline: it
starts, trains one step and writes a checkpoint whose sampler folder loads with transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from searchr1.engines.local.shapes import write_shape
from tests.helpers.scripts import ROOT, load_script


def _converter():
    return load_script("experiments/benchmarks/paper_preset_data.py")


def _questions(folder: Path, n: int = 12) -> Path:
    folder.mkdir()
    with open(folder / "questions.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "question": f"When was thing {i} made?",
                                "golden_answers": [str(1900 + i)], "data_source": "hotpotqa",
                                "supporting_titles": [f"Thing {i}"]}) + "\n")
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": str(i), "contents": f'"Thing {i}"\nThing {i} was made in {1900 + i}.'}) + "\n")
    return folder


def test_converter_splits_questions_into_the_loaders_parquet_files(tmp_path):
    train, test = _converter().convert(_questions(tmp_path / "src"), tmp_path / "pg", test=4)
    assert (train, test) == (8, 4)
    frame = pd.read_parquet(tmp_path / "pg" / "test.parquet")
    assert list(frame["id"]) == ["q8", "q9", "q10", "q11"] and list(frame["golden_answers"][0]) == ["1908"]
    from searchr1.data.nq_hotpotqa import read_examples
    assert [e.id for e in read_examples(tmp_path / "pg" / "train.parquet")][:2] == ["q0", "q1"]


def test_world_gives_a_folder_the_loader_and_bm25_read(tmp_path, capsys):
    """The README's command needs no folder of its own: ``--world`` uses the embedded world."""
    assert _converter().main(["--world", "--out", str(tmp_path / "pg"), "--test", "20"]) == 0
    from searchr1.data.nq_hotpotqa import read_examples
    from searchr1.retrievers.bm25 import read_corpus_jsonl

    test = read_examples(tmp_path / "pg" / "test.parquet")
    assert len(test) == 20 and test[0].data_source.startswith("world_")
    assert len(read_examples(tmp_path / "pg" / "train.parquet")) == 400 + 100 - 20
    assert len(read_corpus_jsonl(tmp_path / "pg" / "corpus.jsonl")) > 1000
    assert "train.parquet 480 rows" in capsys.readouterr().out


def test_a_missing_folder_is_one_paragraph_and_exit_2(tmp_path, capsys):
    assert _converter().main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "pg")]) == 2
    err = capsys.readouterr().err
    assert "has no questions.jsonl and no corpus.jsonl" in err and "--world" in err
    assert not (tmp_path / "pg").exists()


def test_paper_grpo_full_tuning_on_a_local_folder_trains_a_step_and_checkpoints(tmp_path):
    model_dir = write_shape("tiny", tmp_path / "model")
    _converter().convert(_questions(tmp_path / "src"), tmp_path / "pg", test=4)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "searchr1.main", "experiment=paper_grpo", "data.source=local",
           f"data.local_dir={tmp_path / 'pg'}", f"retriever.corpus_path={tmp_path / 'pg' / 'corpus.jsonl'}",
           "protocol.prompt=ours", f"model.hf_id={model_dir}", "model.gguf_file=null", "model.name=tiny",
           "trainer.steps=1", "trainer.save_every=1", "trainer.questions_per_step=2", "rollout.group_size=2",
           "eval.before_training=false", "rollout.max_turn_tokens=16", "rollout.max_observation_tokens=64",
           "rollout.max_prompt_tokens=1024", "engine.max_seq_len=1200", f"hydra.run.dir={run}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    state = json.loads((run / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert state["step"] == 1 and (run / "checkpoints" / "step_000001" / "manifest.json").is_file()
    full = load_file(run / state["engine_state"] / "full_weights.safetensors")
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    assert set(full) >= {n for n, _ in initial.named_parameters()} - {"lm_head.weight"}  # every weight
    sampler = AutoModelForCausalLM.from_pretrained(run / state["sampler_weights"])
    assert sampler.config.hidden_size == initial.config.hidden_size
    shared = [n for n in sampler.state_dict() if n in full]
    assert len(shared) >= len(full) - 1  # lm_head may be tied to the embedding
    for name in shared:  # the sampler's copy is the trained weights
        tensor = sampler.state_dict()[name]
        assert torch.equal(tensor, full[name].to(tensor.dtype)), name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("step") == 1 and "train/loss" in r for r in rows)
