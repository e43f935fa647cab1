"""The paper-scale benchmark's CPU smoke mode: the step runs, the table has its figures and bounds."""

from __future__ import annotations

import json
import sys

from tests.helpers.scripts import load_script


def _module():
    return load_script("experiments/benchmarks/paper_scale.py")


def test_cpu_smoke_step_reports_the_split_and_worst_case_trajectories(tmp_path):
    bench = _module()
    out = tmp_path / "r.json"
    previous = sys.getswitchinterval()
    result = bench.main(["--shape", "tiny", "--device", "cpu", "--questions", "2", "--group", "2",
                         "--out", str(out), "--standalone", "--switch-interval-ms", "1",
                         "rollout.max_searches=1", "rollout.max_turns=2"])
    table = result["table"]
    # the GIL's switch interval held during the steps, and put back after them
    assert result["switch_interval_ms"] == 1.0 and sys.getswitchinterval() == previous
    assert set(table) >= {f"time/{k}_s" for k in bench.SPLIT} | {
        "time/step_s", "rollout/sampled_tokens_per_s", "train/update_tokens_per_s",
        "train/old_logprobs_tokens_per_s", "train/reference_tokens_per_s", "train/update_mfu"}
    assert json.loads(out.read_text())["table"].keys() == table.keys()
    # the scripted policy: one search then the answer, every turn max_turn_tokens (48) long
    assert table["rollout/search_calls"]["value"] == 1.0 and table["rollout/turns"]["value"] == 2.0
    assert table["rollout/action_tokens"] == dict(value=96.0, bound=96.0, ratio=1.0)
    # bounds from the loaded model: decode rows · 4.8e12 / (2 N), update 989e12 / (6 N)
    n = result["n_matmul"]  # tiny: 2 layers of q/k/v (biased), o, 3 MLP, 2 norms + norm + untied head
    assert n == 2 * (64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64 + 49152 * 64
    assert table["rollout/sampled_tokens_per_s"]["bound"] == min(result["kv_slots"], 4) * 4.8e12 / (2 * n)
    assert table["train/update_tokens_per_s"]["bound"] == 989e12 / (6 * n)
    tokens = result["metrics"]["train/tokens_per_rollout_batch"]
    update_s = table["time/update_s"]["value"]
    assert abs(table["train/update_mfu"]["value"] - 6 * n * tokens / update_s / 989e12) < 1e-12
    assert all(table[f"time/{k}_s"]["value"] > 0 for k in ("rollout", "old_logprobs", "reference", "update"))
    # two mini-batches of 2: the reference pass scores all 4 trajectories, the old log-prob pass
    # only the second mini-batch's (the first takes its baseline from its own forward)
    scored = result["split_tokens"]
    assert scored["reference"] == tokens and 0 < scored["old_logprobs"] < tokens
    for name in ("old_logprobs", "reference"):
        rate = table[f"train/{name}_tokens_per_s"]["value"]
        assert abs(rate * table[f"time/{name}_s"]["value"] - scored[name]) < 1e-6 * scored[name]
    # --standalone: the same sampler alone at the step's live rows and at the whole pool, and the
    # paper-size step extrapolated from this step's per-token rates and the pool's standalone rate
    # every step's split and engine counters (here one step: the table's)
    (only,) = result["per_step"]
    assert only["step_s"] == table["time/step_s"]["value"] and only["split"]["rollout"] == table["time/rollout_s"]["value"]
    assert set(only["engine"]) == {"busy_s", "steps", "row_steps", "capture_s", "admit_s"}  # CPU: the HF sampler counts none
    alone = result["standalone"]
    assert alone["pool"]["rows"] == result["kv_slots"] and 1 <= alone["live"]["rows"] <= result["kv_slots"]
    assert all(alone[k]["cached_tokens_per_s"] > 0 and alone[k]["cold_tokens_per_s"] > 0 for k in alone)
    share = table["rollout/sampled_tokens_per_s (of standalone, live rows, cached)"]
    assert share["value"] == table["rollout/sampled_tokens_per_s"]["value"]
    assert share["bound"] == alone["live"]["cached_tokens_per_s"]
    step, rollout = table["time/step_s"]["value"], table["time/rollout_s"]["value"]
    scale = 512 * 5 / 4
    paper = (step - rollout) * scale + result["metrics"]["rollout/sampled_tokens"] * scale / alone["pool"]["cached_tokens_per_s"]
    extrapolated = table["time/step_s at 512 × 5, EXTRAPOLATED (of the 8-min target)"]
    assert abs(extrapolated["value"] - paper) < 1e-9 * paper and extrapolated["bound"] == 480.0
