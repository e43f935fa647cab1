"""Benchmark: request batching in ``LocalSamplingClient`` versus serving requests one by one.

N concurrent ``sample_async`` requests (distinct chat prompts, seeded sampling at
temperature 1) go through the batched queue (default window, ``max_batch_size`` 64), and
the same requests through a client that serves one request per forward batch
(``batch_window_ms=0``, ``max_batch_size=1``). Both use the same seeds, so they generate
the same tokens and do the same useful work. Prints medians over ``--repeats`` runs:

    uv run python experiments/benchmarks/sampler_batching.py --model embedded --requests 8
"""

from __future__ import annotations

import argparse
import asyncio
import string
import time
from dataclasses import dataclass

import torch
from pytrio import ModelInput, SamplingParams

from searchr1.engines.local.model import (
    LocalEngineConfig,
    ModelConfig,
    load_model,
    load_tokenizer,
    resolve_device,
)
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient

QUESTIONS = [
    "Who wrote the novel that the river town is named after?",
    "What is the capital of France?",
    "Which element has the chemical symbol Fe?",
    "In which year did the first person walk on the moon?",
    "Name the longest river in Africa.",
    "Who painted the ceiling of the Sistine Chapel?",
    "What language is spoken in Brazil?",
    "How many planets are in the solar system?",
]


@dataclass
class Run:
    """One timed pass over all requests."""

    seconds: float
    tokens: int
    forward_passes: int


def tiny_model_and_tokenizer(device: torch.device):
    """A 2-layer random Llama over a char-level vocabulary (no files, no network)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits + " .,;:!?'\"-\n"
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(config).to(device).eval(), tokenizer


def load(args: argparse.Namespace):
    """(model, tokenizer) for ``--model``."""
    device = resolve_device(args.device)
    if args.model == "tiny":
        return tiny_model_and_tokenizer(device)
    cfg = ModelConfig()
    return load_model(cfg, device, cfg.dtype, args.cache_dir), load_tokenizer(cfg, args.cache_dir)


def prompts(tokenizer, n: int) -> list[ModelInput]:
    """``n`` chat prompts cycling through ``QUESTIONS`` (lengths differ: padding is real)."""
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append(ModelInput.from_ints(tokenizer.encode(text, add_special_tokens=False)))
    return out


async def timed_run(client: LocalSamplingClient, inputs: list[ModelInput], max_tokens: int) -> Run:
    """Send all requests concurrently and wait for every response."""
    before = client.stats.forward_passes
    start = time.perf_counter()
    responses = await asyncio.gather(
        *[
            client.sample_async(p, 1, SamplingParams(max_tokens=max_tokens, seed=i))
            for i, p in enumerate(inputs)
        ]
    )
    seconds = time.perf_counter() - start
    tokens = sum(len(s.tokens) for r in responses for s in r.sequences)
    return Run(seconds, tokens, client.stats.forward_passes - before)


def measure(client: LocalSamplingClient, inputs: list[ModelInput], args) -> Run:
    """Median run (by wall time) after one warm-up run."""
    asyncio.run(timed_run(client, inputs, args.max_tokens))
    runs = [asyncio.run(timed_run(client, inputs, args.max_tokens)) for _ in range(args.repeats)]
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def table(batched: Run, serial: Run) -> str:
    """Markdown table: figure (batched), reference (one by one), ratio."""
    rows = [
        ("wall seconds", batched.seconds, serial.seconds),
        ("generated tokens / s", batched.tokens / batched.seconds, serial.tokens / serial.seconds),
        ("generated tokens", batched.tokens, serial.tokens),
        ("forward passes", batched.forward_passes, serial.forward_passes),
    ]
    lines = ["| measure | batched (figure) | one by one (reference) | ratio |", "|---|---|---|---|"]
    for name, fig, ref in rows:
        lines.append(f"| {name} | {fig:.3f} | {ref:.3f} | {fig / ref:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "embedded"], default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=LocalEngineConfig().cache_dir)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = default")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args)
    inputs = prompts(tokenizer, args.requests)
    batched = LocalSamplingClient(model, tokenizer, LocalEngineConfig(device=args.device))
    serial_cfg = LocalEngineConfig(device=args.device, batch_window_ms=0.0, max_batch_size=1)
    serial = LocalSamplingClient(model, tokenizer, serial_cfg)
    fig, ref = measure(batched, inputs, args), measure(serial, inputs, args)
    print(
        f"model={args.model} device={args.device} requests={args.requests} "
        f"max_tokens={args.max_tokens} repeats={args.repeats} "
        f"torch_threads={torch.get_num_threads()} (medians)\n"
    )
    print(table(fig, ref))


if __name__ == "__main__":
    main()
