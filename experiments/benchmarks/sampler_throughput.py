"""Sampler throughput: the slot sampler and vLLM side by side, cold and cached, against the card's bound.

Each engine gets ``rows`` concurrent requests of ``--prompt-tokens`` random ids (the same ids for
every engine) and ``--new-tokens`` new tokens at temperature 1, each sequence with its own seed as
the rollout sends them, and is timed by generated tokens per second of wall time:

- **cold**: the first call on those prompts — every prompt is prefilled (both engines were
  warmed first on another small batch, so the weights are loaded and the small graphs captured;
  graph captures the cold call still triggers are reported apart);
- **cached**: repeats of the same call, the prompts' KV kept (the slot sampler's slot reuse,
  vLLM's prefix caching): decode-bound, median of ``--repeats``;
- **uncached**: repeats with the cache emptied before each (slot table invalidated, vLLM's
  prefix cache reset): prefill every time, warm graphs — prefix caching off on both.

``--engine slots vllm`` runs both in one process (the slot sampler first; its pool is freed
before vLLM starts with the rest of the GPU); the first engine named is the reference of the
ratios. vLLM runs in process (``engine.sampler=vllm``'s own client, ``vllm_client.py``) with
``--vllm-unseeded`` adding its unseeded rate (vLLM samples seeded rows one by one). The bound is
the card's (``flops.card``): a decode step streams the weights and every row's keys and values
at the mean context once at the card's bandwidth, or costs 2 FLOPs per weight and row at its
bf16 peak, whichever is lower. References of the slot sampler alone (``--engine slots``): a
left-padded ``model.generate`` (``--no-naive`` skips it) and the compiled static-cache one.

    python experiments/benchmarks/sampler_throughput.py --model qwen2.5-3b-random --rows 512 --prompt-tokens 1700 --engine slots vllm --decode-attention flex --no-naive --static-rows
    python experiments/benchmarks/sampler_throughput.py --model qwen2.5-3b-random --rows 512 --prompt-tokens 1700 --decode-attention flex --prefill masked causal compiled --no-naive --static-rows --repeats 1 --kernels 3
    python experiments/benchmarks/sampler_throughput.py --model smollm2-random --rows 32 128 512
    python experiments/benchmarks/sampler_throughput.py --model embedded --device cpu --rows 4 --new-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time

import torch
from pytrio import ModelInput, SamplingParams
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from searchr1.engines.local.config import LocalEngineConfig, ModelConfig, VllmConfig
from searchr1.engines.local.model import load_model, load_tokenizer
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient
from searchr1.engines.local.sampling.slot_model import Dims
from searchr1.engines.local.sampling.slot_types import WeightsSource
from searchr1.engines.local.shapes import shape_config
from searchr1.engines.local.training import flops
from searchr1.utils.provenance import provenance

SHAPES = {
    "smollm2-random": lambda: LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, tie_word_embeddings=True,
        max_position_embeddings=8192, rms_norm_eps=1e-5),
    "qwen2.5-1.5b-random": lambda: Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen2.5-3b-random": lambda: shape_config("qwen2_5_3b"),  # searchr1/engines/local/shapes.py
}


class _Tok:
    """Stand-in tokenizer for random models: decodes ids to a string of numbers."""

    eos_token_id = None
    pad_token_id = 0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:  # the sampler keeps picks below the tokenizer's length
        return self.vocab

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def load(name: str, device: torch.device):
    if name == "embedded":
        cfg = ModelConfig()
        return load_model(cfg, device, "auto", "~/.cache/searchr1"), load_tokenizer(cfg, "~/.cache/searchr1")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):  # drawn where it runs: seconds, not minutes, for billions of weights
        model = AutoModelForCausalLM.from_config(SHAPES[name](), dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    return model, _Tok(model.config.vocab_size)


def prompts(rows: int, vocab: int, length: int = 64, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (rows, length), generator=g).tolist()


async def sample_all(client, batch: list[list[int]], new: int, seeded: bool = True) -> tuple[float, int]:
    """``len(batch)`` concurrent requests of ``new`` tokens at temperature 1 (row i seeded i);
    (seconds, generated tokens)."""
    params = [SamplingParams(max_tokens=new, temperature=1.0, seed=i if seeded else None) for i in range(len(batch))]
    t0 = time.perf_counter()
    out = await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                 for p, sp in zip(batch, params)))
    return time.perf_counter() - t0, sum(len(r.sequences[0].tokens) for r in out)


def run_client(client, batch: list[list[int]], new: int, seeded: bool = True) -> tuple[float, int]:
    """One call of ``len(batch)`` concurrent requests; (seconds, generated tokens)."""
    return asyncio.run(sample_all(client, batch, new, seeded))


@torch.inference_mode()
def run_generate(model, batch: list[list[int]], new: int, **kw) -> tuple[float, int]:
    ids = torch.tensor(batch, device=model.device)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                         min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0, **kw)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, (out.shape[1] - ids.shape[1]) * ids.shape[0]


@torch.inference_mode()
def logprob_mismatch(model, client, batch: list[list[int]], new: int, rows: int = 8) -> float:
    """Mean |sampler logprob − HF forward logprob| over the sampled tokens of ``rows`` sequences."""
    diffs = []
    for prompt in batch[:rows]:
        seq = client.sample(ModelInput.from_ints(prompt), 1, SamplingParams(max_tokens=new, temperature=1.0, seed=0)).result().sequences[0]
        ids = torch.tensor([prompt + seq.tokens], device=model.device)
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
        ref = logp.gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
        diffs.append((ref - torch.tensor(seq.logprobs)).abs())
    return float(torch.cat(diffs).mean())


def rates(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        seconds, tokens = fn()
        out.append(tokens / seconds)
    return out


def measure(client, batch, new: int, repeats: int, reset, capture_seconds, vocab: int, kernels=None,
            stats=None) -> dict:
    """Warm on another batch, then cold, cached and uncached rates (see the module docstring).

    ``kernels`` (a ``profile_step.KernelProfile`` wrapped around the slot sampler's prefill chunks)
    is armed for the cold call only; ``stats`` (the slot sampler's ``SlotStats``) splits the cold
    call into admission and decode."""
    warm = len(batch[0])  # the same lengths (the same graph buckets), other ids
    run_client(client, prompts(min(8, len(batch)), vocab, warm, seed=99), min(16, new))  # weights in, graphs captured
    captured = capture_seconds()
    admit0, decode0, chunks0 = (stats.admit_seconds, stats.decode_seconds, stats.prefill_chunks) if stats else (0, 0, 0)
    if kernels is not None:
        kernels.armed = True
    cold_s, cold_tokens = run_client(client, batch, new)
    if kernels is not None:
        kernels.armed = False
    row = {"cold_s": cold_s, "cold_tok_s": cold_tokens / cold_s, "cold_capture_s": capture_seconds() - captured}
    if stats is not None:  # where the slot sampler's cold call went: admission (prefill) and decode windows
        row["cold_admit_s"] = stats.admit_seconds - admit0
        row["cold_decode_s"] = stats.decode_seconds - decode0
        row["cold_prefill_chunks"] = stats.prefill_chunks - chunks0
    row["cached_tok_s"] = statistics.median(rates(lambda: run_client(client, batch, new), repeats))

    def uncached():
        reset()
        return run_client(client, batch, new)

    row["uncached_tok_s"] = statistics.median(rates(uncached, repeats))
    return row


def slots_client(model, tokenizer, rows: int, attention: str, max_len: int, prefill: str = "causal") -> LocalSamplingClient:
    """The slot sampler with a pool of ``rows``; ``prefill``: ``causal`` (the default: fresh chunks
    attend causally over their own keys), ``masked`` (every chunk through the boolean mask,
    ``prefill.CAUSAL_FRESH`` off) or ``compiled`` (causal, ``engine.compile_prefill=true``)."""
    from searchr1.engines.local.sampling import prefill as prefill_module

    prefill_module.CAUSAL_FRESH = prefill != "masked"
    cfg = LocalEngineConfig(sampler="slots", kv_slots=rows, decode_attention=attention, max_seq_len=max_len,
                            compile_prefill=prefill == "compiled",
                            sync_every=16)
    return LocalSamplingClient(model, tokenizer, cfg)


def vllm_client(model, tokenizer, rows: int, max_len: int):
    """vLLM in this process, as ``engine.sampler=vllm`` builds it, with the GPU's free memory."""
    from searchr1.engines.local.memory import HEADROOM
    from searchr1.engines.local.sampling.vllm_api import VllmApi
    from searchr1.engines.local.sampling.vllm_client import VllmSamplingClient
    from searchr1.engines.local.sampling.vllm_engine import VllmEngine
    from searchr1.engines.local.sampling.vllm_setup import engine_args, hf_weights, model_folder

    api = VllmApi()
    folder, has_tok = model_folder(model, tokenizer, tempfile.mkdtemp(prefix="vllm-bench-"))
    free, total = torch.cuda.mem_get_info()
    args = engine_args(VllmConfig(max_num_seqs=rows), folder, has_tok, model.dtype, max_len,
                       HEADROOM * free / total, 0)
    t0 = time.perf_counter()
    engine = api.open_engine(args)
    startup = time.perf_counter() - t0
    worker = VllmEngine(api, engine, hf_weights, sleep_level=2)
    client = VllmSamplingClient(worker, WeightsSource(model), tokenizer, max_len, scorer=None, detokenize=has_tok)
    return client, startup, api.version


def prefill_kernel_profile(calls: int):
    """A ``profile_step.KernelProfile`` around the slot sampler's prefill chunks (eager and graphed)."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import profile_step

    from searchr1.engines.local.sampling import prefill, slot_engine

    kernels = profile_step.KernelProfile(calls)
    slot_engine.run_eager = kernels.wrap(prefill.run_eager)  # the engine calls it by this name
    prefill.PrefillGraphs.run = kernels.wrap(prefill.PrefillGraphs.run)
    return kernels


def bound(model, rows: int, context: float, card: flops.Card) -> float:
    """The lower of the KV-read and compute bounds (tokens/s) on ``card``."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    dims = Dims.of(model.config)
    kv_bytes = dims.layers * 2 * dims.kv_heads * dims.head_dim * 2  # bf16 K and V per token
    kv = rows * card.hbm_bytes_per_s / (weight_bytes + rows * kv_bytes * context)
    return min(kv, card.bf16_flops / (2 * flops.matmul_weights(model)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-random", choices=["embedded", *SHAPES])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="each row's prompt (the paper's turns decode at ~1.7k)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", nargs="+", default=["slots"], choices=["slots", "vllm"],
                    help="engines to time, in this order; the first is the ratios' reference")
    ap.add_argument("--vllm-unseeded", action="store_true", help="also vLLM's cached rate without per-row seeds")
    ap.add_argument("--decode-attention", nargs="+", default=["grouped"], choices=["grouped", "flex"],
                    help="engine.decode_attention of the slot sampler (several: each is timed)")
    ap.add_argument("--prefill", nargs="+", default=["causal"], choices=["causal", "masked", "compiled"],
                    help="the slot sampler's prefill (several: each is timed; see slots_client)")
    ap.add_argument("--static-rows", type=int, nargs="*", default=[128], help="rows for the compiled static-cache reference")
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="profile the slot sampler's first N prefill chunks of the cold call by kernel (torch.profiler)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    kernels = None
    if args.kernels:
        kernels = prefill_kernel_profile(args.kernels)
    device = torch.device(args.device)
    model, tokenizer = load(args.model, device)
    vocab = model.config.vocab_size
    max_len = args.prompt_tokens + args.new_tokens + 16
    card = flops.card() if device.type == "cuda" else flops.Card("cpu", 0.0, 0.0)
    results = []
    for rows in args.rows:
        batch = prompts(rows, vocab, args.prompt_tokens)
        variants = [("slots", a, p) for a in args.decode_attention for p in args.prefill if "slots" in args.engine]
        variants += [("vllm", "-", "-")] if "vllm" in args.engine else []  # vLLM last: it keeps its memory
        for engine, attention, prefill in variants:
            row = {"rows": rows, "engine": engine, "decode_attention": attention, "prefill": prefill}
            first = (attention, prefill) == (args.decode_attention[0], args.prefill[0])
            if engine == "slots":
                client = slots_client(model, tokenizer, rows, attention, max_len, prefill)
                row.update(measure(client, batch, args.new_tokens, args.repeats, client.slots.table.invalidate,
                                   lambda: client.slots.stats.capture_seconds, vocab, kernels, client.slots.stats))
                if kernels is not None and kernels.done:
                    print(f"{variant(row)}, {rows} rows: the cold call's first prefill chunks by kernel\n"
                          + kernels.table(20), flush=True)
                    row["cold_prefill_kernels"] = {k: v for k, v in sorted(
                        kernels.totals.items(), key=lambda kv: -kv[1][0])[:40]}
                    row["cold_prefill_profiled"] = {"chunks": kernels.done, "wall_s": kernels.wall}
                    kernels.reset()
                row["capture_s"] = client.slots.stats.capture_seconds
            else:
                client, startup, version = vllm_client(model, tokenizer, rows, max_len)
                row.update(measure(client, batch, args.new_tokens, args.repeats, client.engine.engine.reset_prefix_cache,
                                   lambda: 0.0, vocab), startup_s=startup, vllm=version)
                if args.vllm_unseeded:
                    row["cached_unseeded_tok_s"] = statistics.median(
                        rates(lambda: run_client(client, batch, args.new_tokens, seeded=False), args.repeats))
            row["logprob_mismatch"] = logprob_mismatch(model, client, batch, min(args.new_tokens, 64))
            row["bound_tok_s"] = bound(model, rows, args.prompt_tokens + args.new_tokens / 2, card) if card.bf16_flops else 0.0
            if engine == "slots":
                if not args.no_naive and first:
                    row["naive_tok_s"] = rates(lambda: run_generate(model, batch, args.new_tokens), 1)[0]
                if rows in args.static_rows and device.type == "cuda" and first:
                    try:  # transformers compiles the forward itself for a static cache (its first call)
                        run_generate(model, batch, args.new_tokens, cache_implementation="static")
                        row["static_tok_s"] = rates(lambda: run_generate(model, batch, args.new_tokens,
                                                                         cache_implementation="static"), 1)[0]
                    except Exception as error:  # noqa: BLE001 - a reference failing must not lose the run
                        row["static_error"] = f"{type(error).__name__}: {str(error)[:200]}"
                client.slots.close()
                del client
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            results.append(row)
            print(json.dumps(row), flush=True)
    print_table(args, results, card)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "device": args.device, **provenance(),
                       "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "results": results}, f, indent=1)


def variant(row: dict) -> str:
    """A result row's engine as the table names it: ``vllm`` or ``slots/<decode attention>/<prefill>``."""
    return row["engine"] if row["engine"] == "vllm" else f"slots/{row['decode_attention']}/{row['prefill']}"


def print_table(args, results: list[dict], card: flops.Card) -> None:
    print(f"\nsampler throughput, {args.model} on {card.name}, {args.prompt_tokens}-token prompts, "
          f"{args.new_tokens} new tokens per row, temperature 1, a seed per row (tokens/s; repeats: medians of "
          f"{args.repeats}); bound = the lower of one pass over the weights and the rows' KV at the mean context "
          f"at {card.hbm_bytes_per_s / 1e12:.2f} TB/s and 2 FLOPs per weight and token at {card.bf16_flops / 1e12:.0f} TFLOP/s")
    cols = ("cold_tok_s", "cached_tok_s", "uncached_tok_s")
    print(f"{'rows':>5} {'engine':>20} {'cold s':>7} {'capture s':>9} {'cold':>8} {'cached':>8} {'uncached':>9} "
          f"{'bound':>8} {'cached/bound':>12} {'vs ' + args.engine[0] + ' cold/cached/uncached':>32} {'|Δlogp|':>8}")
    for r in results:
        ref = next((b for b in results if b["rows"] == r["rows"] and b["engine"] == args.engine[0]), r)
        name = variant(r)
        ratio = "/".join(f"{r[c] / ref[c]:.2f}" for c in cols)
        capture = r.get("cold_capture_s", 0.0) + r.get("startup_s", 0.0)
        of_bound = f"{r['cached_tok_s'] / r['bound_tok_s']:12.3f}" if r["bound_tok_s"] else f"{'-':>12}"
        print(f"{r['rows']:>5} {name:>20} {r['cold_s']:7.1f} {capture:9.1f} {r['cold_tok_s']:8.0f} {r['cached_tok_s']:8.0f} "
              f"{r['uncached_tok_s']:9.0f} {r['bound_tok_s']:8.0f} {of_bound} {ratio:>32} {r['logprob_mismatch']:8.4f}")
    for r in results:
        extra = {k: round(v) for k, v in r.items() if k in ("naive_tok_s", "static_tok_s", "cached_unseeded_tok_s")}
        if "cold_admit_s" in r:
            extra["cold admission s"] = round(r["cold_admit_s"], 2)
            extra["cold decode s"] = round(r["cold_decode_s"], 2)
        if extra:
            print(f"  {r['rows']} rows, {variant(r)}: " + ", ".join(f"{k} {v}" for k, v in extra.items()))
    print("capture s: graph captures inside the cold call (slots) or vLLM's start-up (vllm: allocation, compile, graphs)")


if __name__ == "__main__":
    main()
