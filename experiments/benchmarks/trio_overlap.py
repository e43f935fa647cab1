"""trio_overlap — step time with ``trainer.max_staleness`` 0 vs 1 on the fake PyTRIO server.

The server is ``tests/helpers/trio_fake.py``'s, behind httpx's transport, with a latency model
(``tests/test_staleness.TimedTrio``): every sampling request takes ``--sample-latency`` s (a
lab trajectory here is two turns, so a rollout is about two of them), a forward_backward
``--fb-latency`` s and an optim_step ``--optim-latency`` s. pytrio's real clients, the
rollout engine, the protocol, the reward and the trainer run unchanged; only the network
is replaced.

Figures (medians over the steady-state steps, i.e. all but the first):
- staleness 0 step time vs reference = rollout + train (both measured in that run);
- staleness 1 step time vs reference = max(rollout, train); target ratio ≤ 1.15.

    uv run python experiments/benchmarks/trio_overlap.py [--steps 6] [--out overlap.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import pytest
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.loop.test_staleness import FB, OPTIM, TimedTrio, run_trainer  # noqa: E402
from tests.protocols.test_tool_call import FIXTURES, make_tokenizer  # noqa: E402
from tests.engines.test_trio import lab_policy  # noqa: E402


def measure(tok_dir: Path, staleness: int, steps: int, delays: dict) -> dict:
    from pytrio.config.config import auth_state

    server_tok = AutoTokenizer.from_pretrained(tok_dir)
    fake = TimedTrio(str(tok_dir), decode=lambda t: server_tok.decode(t, skip_special_tokens=False),
                     delays=delays)
    fake.policy = lab_policy(server_tok)
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as run_dir:
        mp.setattr(auth_state, "api_key", "sk-bench")
        mp.setattr(auth_state, "config_error", None)
        fake.install(mp)
        summary, tracker = run_trainer(fake, tok_dir, Path(run_dir), staleness, steps)
    assert not fake.unexpected, fake.unexpected
    ms = tracker.train_metrics()[1:]  # steady state: the first step has nothing to overlap
    med = lambda key: statistics.median(m[key] for m in ms)  # noqa: E731
    return {"staleness": staleness, "steps": steps, "step_s": med("time/step_seconds"),
            "rollout_s": med("time/rollout"), "train_s": med("time/train"),
            "staleness_logged": [m["train/staleness"] for m in tracker.train_metrics()],
            "optim_steps": len(fake.of(OPTIM)), "forward_backward": len(fake.of(FB)),
            "wall_s": summary["wall_seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sample-latency", type=float, default=0.6)
    ap.add_argument("--fb-latency", type=float, default=0.5)
    ap.add_argument("--optim-latency", type=float, default=0.4)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    delays = {"sample": args.sample_latency, FB: args.fb_latency, OPTIM: args.optim_latency}
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = Path(tmp) / "tok"
        make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text()).save_pretrained(tok_dir)
        s0 = measure(tok_dir, 0, args.steps, delays)
        s1 = measure(tok_dir, 1, args.steps, delays)
    rollout, train = s0["rollout_s"], s0["train_s"]
    rows = [("staleness 0 step s", s0["step_s"], "rollout + train", rollout + train),
            ("staleness 1 step s", s1["step_s"], "max(rollout, train)", max(rollout, train)),
            ("staleness 1 step s", s1["step_s"], "staleness 0 step s", s0["step_s"])]
    print(f"latency model: sample {args.sample_latency} s/request, forward_backward "
          f"{args.fb_latency} s, optim_step {args.optim_latency} s; {args.steps} steps, "
          f"medians of steps 2..{args.steps}")
    print(f"staleness 0: rollout {rollout:.3f} s, train {train:.3f} s; "
          f"train/staleness logged {s0['staleness_logged']} / {s1['staleness_logged']}")
    print(f"| figure | value | reference | value | ratio |\n|---|---:|---|---:|---:|")
    for name, v, ref_name, ref in rows:
        print(f"| {name} | {v:.3f} | {ref_name} | {ref:.3f} | {v / ref:.3f} |")
    ratio = s1["step_s"] / max(rollout, train)
    print(f"target staleness-1 / max(rollout, train) <= 1.15: {'met' if ratio <= 1.15 else 'NOT met'} ({ratio:.3f})")
    if args.out:
        args.out.write_text(json.dumps({"delays": delays, "staleness_0": s0, "staleness_1": s1,
                                        "ratio_vs_max": ratio}, indent=2))


if __name__ == "__main__":
    main()
