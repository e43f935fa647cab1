"""Random-weight HF folders of real model shapes, for paper-scale memory and speed without downloads.

``write_shape("qwen2_5_3b", out)`` writes ``config.json`` + safetensors (random init, bf16) +
a tokenizer, loadable as ``model.hf_id=<out> model.gguf_file=null``. The tokenizer is the
embedded SmolLM2 one (49,152 tokens, made offline from the packaged GGUF); the model's
vocabulary keeps the real size, padded above the tokenizer's, so the embedding and lm_head
cost what the real model's do. ``layers`` shrinks the depth for tests.

Numbers (from the published ``config.json`` of each hub repo):

| shape       | hidden | layers | heads | kv | intermediate | vocab   | rope θ    | tied |
|-------------|--------|--------|-------|----|--------------|---------|-----------|------|
| qwen2_5_3b  | 2048   | 36     | 16    | 2  | 11008        | 151936  | 1,000,000 | yes  |
| qwen2_5_7b  | 3584   | 28     | 28    | 4  | 18944        | 152064  | 1,000,000 | no   |
| smollm2_135m| 576    | 30     | 9     | 3  | 1536         | 49152   | 100,000   | yes  |
| tiny        | 64     | 2      | 4     | 2  | 128          | 49152   | 10,000    | no   |

``smollm2_135m`` is the embedded model's size in the Qwen2 layout (its q/k/v biases add
0.05% of the parameters), for benchmarks of the world-scale step without the GGUF.

Sources: huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json and
huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json (rms_norm_eps 1e-6, q/k/v bias).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from searchr1.engines.local.config import ModelConfig
from searchr1.engines.local.model import load_tokenizer

SHAPES: dict[str, dict] = {
    "qwen2_5_3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, intermediate_size=11008, vocab_size=151936,
                       rope_theta=1_000_000.0, tie_word_embeddings=True),
    "qwen2_5_7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
                       rope_theta=1_000_000.0, tie_word_embeddings=False),
    "smollm2_135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, rope_theta=100_000.0, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=49152, rope_theta=10_000.0, tie_word_embeddings=False),
}


def shape_config(shape: str, layers: int | None = None, vocab_floor: int = 0) -> Qwen2Config:
    """The HF config of a named shape (``layers`` overrides the depth; vocab ≥ ``vocab_floor``)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
    values = dict(SHAPES[shape])
    if layers is not None:
        values["num_hidden_layers"] = layers
    values["vocab_size"] = max(values["vocab_size"], vocab_floor)
    return Qwen2Config(**values, max_position_embeddings=32768, rms_norm_eps=1e-6,
                       hidden_act="silu", use_sliding_window=False)


def write_shape(shape: str, out: str | Path, layers: int | None = None, tokenizer=None,
                seed: int = 0, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> Path:
    """Write a random-weight model of ``shape`` and ``tokenizer`` (default: SmolLM2's) to ``out``.

    ``device`` is where the weights are drawn (``cuda``: seconds instead of minutes for billions
    of parameters; the values then differ from a CPU draw of the same seed).
    """
    out = Path(out)
    tokenizer = tokenizer if tokenizer is not None else _offline_tokenizer()
    config = shape_config(shape, layers, vocab_floor=len(tokenizer))
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _offline_tokenizer():
    return load_tokenizer(ModelConfig(), "~/.cache/searchr1")


def saved_tokenizer(folder: str | Path):
    """The tokenizer saved in ``folder`` (``save_pretrained``); a clear error when the folder or
    its ``tokenizer.json`` is missing (on the device machine: a folder not carried in this call)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no saved tokenizer in {folder} (expected {folder / 'tokenizer.json'}); "
                                "save one with AutoTokenizer.save_pretrained, and on the device machine "
                                "carry its folder in the same call")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=None, help="override the depth (tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the weights are drawn (cuda: seconds for 3B)")
    parser.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: the embedded model's)")
    args = parser.parse_args(argv)
    tokenizer = saved_tokenizer(args.tokenizer) if args.tokenizer else None
    print(write_shape(args.shape, args.out, args.layers, tokenizer=tokenizer, seed=args.seed, device=args.device))


if __name__ == "__main__":
    main()
