"""Random-weight folders of real shapes: the published numbers, and a shrunk one loads and runs."""

from __future__ import annotations

import pytest
import torch

from searchr1.engines.local.config import ModelConfig
from searchr1.engines.local.model import load_model, load_tokenizer
from searchr1.engines.local.shapes import main, saved_tokenizer, shape_config


def test_shape_configs_carry_the_published_numbers() -> None:
    c = shape_config("qwen2_5_3b")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size, c.rope_parameters["rope_theta"], c.tie_word_embeddings) == (
        2048, 36, 16, 2, 11008, 151936, 1_000_000.0, True)
    c = shape_config("qwen2_5_7b", layers=2, vocab_floor=160_000)
    assert (c.hidden_size, c.num_hidden_layers, c.num_key_value_heads, c.intermediate_size,
            c.vocab_size, c.tie_word_embeddings) == (3584, 2, 4, 18944, 160_000, False)


def test_written_folder_loads_as_hf_id_and_runs_a_forward(tmp_path) -> None:
    main(["--shape", "tiny", "--out", str(tmp_path / "m"), "--layers", "2"])
    cfg = ModelConfig(name="tiny", hf_id=str(tmp_path / "m"), gguf_file=None)
    tok = load_tokenizer(cfg, tmp_path)
    model = load_model(cfg, "cpu", "float32", tmp_path)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size >= len(tok)
    ids = torch.tensor([tok.encode("what is the capital of france?")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()


def test_a_saved_tokenizer_folder_round_trips_and_a_missing_one_is_named(tmp_path) -> None:
    main(["--shape", "tiny", "--out", str(tmp_path / "m"), "--layers", "1"])
    tok = load_tokenizer(ModelConfig(name="tiny", hf_id=str(tmp_path / "m"), gguf_file=None), tmp_path)
    tok.save_pretrained(tmp_path / "tok")
    again = saved_tokenizer(tmp_path / "tok")
    assert again.encode("who wrote hamlet?") == tok.encode("who wrote hamlet?")
    # a folder the device call did not carry: the error names the file it looked for
    with pytest.raises(FileNotFoundError, match=r"not_carried/tokenizer\.json"):
        saved_tokenizer(tmp_path / "not_carried")
