"""Study report: bootstrap intervals, verdicts and the command line, on synthetic runs with
known true effects (written to tmp folders in the layout a Hydra run or a wandb export has).
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import yaml

from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.__main__ import main
from searchr1.analysis.report.arms import group_arms
from searchr1.analysis.report.loading import load_runs
from searchr1.analysis.report.measures import Settings, curve_figures, difference, parse_metric
from searchr1.analysis.report.plots import arm_style

SOURCES = ("world_1hop", "world_2hop", "world_3hop", "world_compare")
PNG = b"\x89PNG\r\n\x1a\n"


def _questions(n_per_source: int, rng: np.random.Generator) -> list[tuple[str, str, float]]:
    """(id, source, true success probability) for each question of a synthetic eval set."""
    return [(f"{src}-{i}", src, float(rng.uniform(0.1, 0.6)))
            for src in SOURCES for i in range(n_per_source)]


def _record(qid: str, source: str, em: float, searches: int) -> dict:
    turns = [{"action": "search"}] * searches + [{"action": "answer"}]
    return {"id": qid, "question": "?", "golden_answers": ["x"], "data_source": source,
            "group_index": 0, "answer": "x", "reward": em, "scores": {"em": em, "format": 1.0},
            "end_reason": "answer", "num_searches": searches, "num_tokens": 50, "turns": turns}


def write_run(run_dir, overrides, questions, lift, rng, *, steps=20, configured=20,
              eval_every=10, summary=True, shuffle=False, searches=None):
    """A run folder: overrides, metrics.jsonl, eval trajectories at every eval step, summary.

    Each eval answers question q correctly with probability p_q + lift (clipped to [0, 1]);
    ``lift`` may be a function of the step. Each trajectory makes 1–3 searches at random, or
    ``searches(step, source, rng)``.
    """
    lift_at = lift if callable(lift) else (lambda step: lift)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([*overrides, f"trainer.steps={configured}"]))
    lines, last_eval = [], {}
    for step in range(steps + 1):
        row = {"step": step}
        if step:
            row.update({"rollout/degenerate_group_rate": float(rng.uniform(0.2, 0.4)),
                        "reward/format": 0.9, "rollout/action_tokens": 100.0 + step})
        if step % eval_every == 0:
            recs = [_record(q, s, float(rng.random() < min(p + lift_at(step), 1.0)),
                            int(rng.integers(1, 4)) if searches is None else searches(step, s, rng))
                    for q, s, p in questions]
            if shuffle:
                rng.shuffle(recs)
            out = run_dir / "eval" / f"step_{step:06d}"
            out.mkdir(parents=True)
            (out / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            per_source = {s: np.mean([r["scores"]["em"] for r in recs if r["data_source"] == s])
                          for s in SOURCES}
            last_eval = {f"eval/em/{s}": float(v) for s, v in per_source.items()}
            last_eval["eval/em/macro"] = float(np.mean(list(per_source.values())))
            last_eval["eval/format_rate"] = 1.0
            row.update(last_eval)
        lines.append(json.dumps(row))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if summary:
        (run_dir / "summary.json").write_text(json.dumps({**last_eval, "steps": steps}))


def write_sweep(root, lift_b, *, seeds=(0, 1, 2), n_per_source=40, seed=0, **kwargs):
    """A sweep folder: arm A (``advantage=grpo``) and arm B (``advantage=lab``) × seeds."""
    rng = np.random.default_rng(seed)
    questions = _questions(n_per_source, rng)
    job = 0
    for arm, lift in (("grpo", 0.0), ("lab", lift_b)):
        for s in seeds:
            write_run(root / str(job), [f"advantage={arm}", f"seed={s}"], questions, lift, rng, **kwargs)
            job += 1
    return root


CLAIM = {"claim": "the lab beats GRPO", "a": {"advantage": "grpo"}, "b": {"advantage": "lab"},
         "direction": "b>a", "paper": {"a": 0.30, "b": 0.40}}


def _claims_file(tmp_path, *claims):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(list(claims)))
    return path


# ------------------------------------------------------------------- bootstrap statistics


def test_paired_point_estimate_by_hand():
    """Macro weighs sources equally, micro weighs questions; the two disagree in sign here."""
    strata = ["x", "x", "x", "y"]
    a = np.array([[1, 0, 1, 0], [1, 1, 0, 1]], dtype=float)  # macro 1/3 and 5/6; micro .5, .75
    b = np.array([[1, 1, 1, 0]], dtype=float)                # macro 1/2; micro .75
    rng = np.random.default_rng(0)
    macro = bs.paired(a, b, strata, macro=True, n_resamples=200, rng=rng)
    micro = bs.paired(a, b, strata, macro=False, n_resamples=200, rng=rng)
    assert macro.point == pytest.approx(0.5 - 7 / 12)
    assert micro.point == pytest.approx(0.75 - 0.625)
    assert macro.low <= macro.point <= macro.high
    assert macro.n_seeds == (2, 1) and macro.n_questions == 4


def test_paired_difference_aligns_questions_by_id(tmp_path):
    """Runs list questions in different orders; the difference is on matching ids."""
    rng = np.random.default_rng(3)
    questions = _questions(5, rng)
    write_run(tmp_path / "a", ["advantage=grpo", "seed=0"], questions, 0.0, rng, steps=0)
    write_run(tmp_path / "b", ["advantage=lab", "seed=0"], questions, 0.3, rng, steps=0, shuffle=True)
    arms = group_arms(load_runs([tmp_path]))
    rows = [run.questions[0].set_index("id")["em"] for arm in arms for run in arm.runs]
    expected = (rows[1] - rows[0].loc[rows[1].index]).mean()  # equal sources → micro = mean diff
    est = difference(arms[0], arms[1], parse_metric("em/micro"), "final", Settings(n_resamples=200))
    assert est.note == "" and est.interval.method == "paired seeds × questions"
    assert est.interval.point == pytest.approx(expected)


def test_hierarchical_interval_covers_the_true_mean():
    """Seeds i.i.d. Bernoulli(0.4) on 200 questions: the 95 % interval covers 0.4 nearly always."""
    rng = np.random.default_rng(1)
    strata = np.repeat(SOURCES, 50)
    covered = 0
    for _ in range(40):
        values = (rng.random((4, 200)) < 0.4).astype(float)
        iv = bs.hierarchical(values, strata, macro=True, n_resamples=300, rng=rng)
        assert iv.low < iv.point < iv.high
        covered += iv.low <= 0.4 <= iv.high
    assert covered >= 34  # ≥ 85 % of 40


def test_null_effect_is_rarely_called_reproduced():
    """No true difference: over 40 replications a claimed B > A is 'reproduced' ≤ 10 % of the time."""
    rng = np.random.default_rng(2)
    strata = np.repeat(SOURCES, 30)
    verdicts = []
    for _ in range(40):
        p = rng.uniform(0.1, 0.7, size=len(strata))  # per-question difficulty, shared by arms
        a = (rng.random((3, len(p))) < p).astype(float)
        b = (rng.random((3, len(p))) < p).astype(float)
        iv = bs.paired(a, b, strata, macro=True, n_resamples=300, rng=rng)
        verdicts.append(bs.verdict(iv, +1))
    assert verdicts.count(bs.REPRODUCED) <= 4
    assert verdicts.count(bs.INCONCLUSIVE) >= 32


def test_verdict_rules():
    def iv(low, high):
        return bs.Interval((low + high) / 2, low, high, "test", 2)

    assert bs.verdict(iv(0.01, 0.2), +1) == bs.REPRODUCED
    assert bs.verdict(iv(0.01, 0.2), -1) == bs.OPPOSITE
    assert bs.verdict(iv(-0.2, -0.01), -1) == bs.REPRODUCED
    assert bs.verdict(iv(-0.1, 0.1), +1) == bs.INCONCLUSIVE
    assert bs.verdict(bs.NAN_INTERVAL, +1) == bs.INCONCLUSIVE


def test_curve_figures_by_hand():
    import pandas as pd

    series = pd.Series([0.1, 0.4, 0.1, 0.5, 0.2], index=[0, 10, 20, 30, 40])
    c = curve_figures(series, collapse_fraction=0.5)
    assert c.final == 0.2 and c.final_step == 40
    assert c.steps_to_90 == 10  # first eval ≥ 0.18
    assert c.max_drop == pytest.approx(0.3)
    assert c.collapses == 2  # 0.1 < 0.5 × 0.4 and 0.2 < 0.5 × 0.5
    assert math.isnan(curve_figures(pd.Series([0.3, 0.0]), 0.5).steps_to_90)


# ------------------------------------------------------------------- the command line


def test_planted_effect_is_found_and_reproduced(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", lift_b=0.25)
    out = tmp_path / "report"
    claims = _claims_file(tmp_path, CLAIM, {**CLAIM, "claim": "GRPO beats the lab", "direction": "b<a"})
    assert main([str(sweep), "--out", str(out), "--claims", str(claims), "--resamples", "300"]) == 0
    results, table = (out / "results.md").read_text(), (out / "claims.md").read_text()
    assert "| the lab beats GRPO |" in table and "**reproduced**" in table
    assert "| GRPO beats the lab |" in table and "**opposite**" in table
    assert "0.300 → 0.400 (+0.100)" in table
    assert "300 resamples, generator seed 0" in results
    assert "| A1 | advantage=grpo | 0, 1, 2 | 0, 1, 2 | 20/20/20 | complete |" in results
    line = next(ln for ln in results.splitlines() if ln.startswith("| A1 | A2 |"))
    diff = float(line.split("|")[4].split("[")[0])
    assert 0.17 < diff < 0.33 and "| A1 | A2 | final |" in line and "B > A" in line and "| 160 |" in line
    for name in ("em_by_source", "format_rate", "searches_by_hop", "degenerate_groups",
                 "response_length"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG


def test_claim_gaps_show_where_an_effect_starts_and_stop_where_a_run_stopped(tmp_path):
    """Arm B gains 0.35 from step 20 on, and its seed 1 stops at step 30. Each claim's gaps
    cover the steps every run reached (0–30): no call before the effect, the claimed side from
    it (✓), the other side for the reversed claim (✗)."""
    rng = np.random.default_rng(11)
    questions = _questions(40, rng)
    root = tmp_path / "sweep"

    def late(step):
        return 0.35 if step >= 20 else 0.0

    for s in (0, 1):
        write_run(root / f"a{s}", ["advantage=grpo", f"seed={s}"], questions, 0.0, rng, steps=40)
    write_run(root / "b0", ["advantage=lab", "seed=0"], questions, late, rng, steps=40)
    write_run(root / "b1", ["advantage=lab", "seed=1"], questions, late, rng, steps=30, summary=False)
    out = tmp_path / "report"
    claims = _claims_file(tmp_path, {**CLAIM, "step": "common"},
                          {**CLAIM, "claim": "GRPO beats the lab", "direction": "b<a", "step": 10})
    assert main([str(root), "--out", str(out), "--claims", str(claims), "--resamples", "300"]) == 0
    with (out / "claim_gaps.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    ours = [r for r in rows if r["claim"] == "the lab beats GRPO"]
    assert [int(r["step"]) for r in ours] == [0, 10, 20, 30]
    assert [r["verdict"] for r in ours] == ["inconclusive", "inconclusive", "reproduced", "reproduced"]
    assert float(ours[0]["low"]) < 0 < float(ours[0]["high"]) and float(ours[3]["b_minus_a"]) > 0.2
    reverse = [r["verdict"] for r in rows if r["claim"] == "GRPO beats the lab"]
    assert reverse == ["inconclusive", "inconclusive", "opposite", "opposite"]
    results = (out / "results.md").read_text()
    section = results.split("## Claims over training")[1].split("\n## ")[0]
    assert "| claim | 0 | 10 | 20 | 30 |" in section
    line = next(ln for ln in section.splitlines() if ln.startswith("| the lab beats GRPO | "))
    assert [c.strip().endswith(" ✓") for c in line.split("|")[2:-1]] == [False, False, True, True]
    line = next(ln for ln in section.splitlines() if ln.startswith("| GRPO beats the lab | "))
    assert [c.strip().endswith(" ✗") for c in line.split("|")[2:-1]] == [False, False, True, True]
    assert "step 10 (10)" in results  # the claims table still judges each claim at its own step
    assert (out / "claim_gaps.png").read_bytes()[:8] == PNG


def test_baseline_puts_one_arm_against_every_other(tmp_path):
    """Three arms: by default every pair; ``--baseline`` compares the named run's arm with each
    other arm only, as A; an unknown run label exits 2 and lists the runs."""
    rng = np.random.default_rng(7)
    questions = _questions(20, rng)
    root = tmp_path / "sweep"
    for name, arm, lift in (("ppo_s0", "ppo", 0.0), ("grpo_s0", "grpo", 0.3), ("lab_s0", "lab", 0.0)):
        write_run(root / name, [f"advantage={arm}", "seed=0"], questions, lift, rng)
    out = tmp_path / "report"
    args = [str(root), "--out", str(out), "--resamples", "200", "--no-plots"]
    assert main(args) == 0
    lines = (out / "results.md").read_text().splitlines()
    pairs = [ln for ln in lines if ln.startswith("| A") and " | final | " in ln]
    assert [ln[:12] for ln in pairs] == ["| A1 | A2 | ", "| A1 | A3 | ", "| A2 | A3 | "]
    assert main(args + ["--baseline", "lab_s0"]) == 0  # arms in folder order: grpo A1, lab A2, ppo A3
    results = (out / "results.md").read_text()
    assert "| A2 | advantage=lab | lab_s0 | 0 |" in results
    pairs = [ln for ln in results.splitlines() if ln.startswith("| A") and " | final | " in ln]
    assert [ln[:12] for ln in pairs] == ["| A2 | A1 | ", "| A2 | A3 | "]
    assert "B > A" in pairs[0]  # grpo's lift of 0.3 over lab
    assert "Arm A is A2, the baseline (`--baseline`)." in results
    assert main(args + ["--baseline", "nope_s9"]) == 2


def test_null_effect_in_the_report_is_inconclusive(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", lift_b=0.0, seed=5)
    out = tmp_path / "report"
    claims = _claims_file(tmp_path, CLAIM)
    assert main([str(sweep), "--out", str(out), "--claims", str(claims), "--resamples", "300",
                 "--no-plots"]) == 0
    assert "**inconclusive**" in (out / "claims.md").read_text()


def test_an_arm_of_one_seed_is_not_called_reproduced(tmp_path):
    """A planted lift of 0.3 with B at one seed: its interval excludes 0 (questions resampled),
    yet one seed cannot tell how far another would land, so the verdict is 'too few seeds' and
    the gaps mark it '?'; --min-seeds 1 accepts the interval as it is."""
    rng = np.random.default_rng(7)
    questions = _questions(30, rng)
    root = tmp_path / "sweep"
    for job, s in enumerate((0, 1)):
        write_run(root / str(job), ["advantage=grpo", f"seed={s}"], questions, 0.0, rng)
    write_run(root / "2", ["advantage=lab", "seed=0"], questions, 0.3, rng)
    claims = _claims_file(tmp_path, CLAIM)
    verdicts = {}
    for min_seeds in ("2", "1"):
        out = tmp_path / f"report{min_seeds}"
        assert main([str(root), "--out", str(out), "--claims", str(claims), "--resamples", "300",
                     "--no-plots", "--min-seeds", min_seeds]) == 0
        verdicts[min_seeds] = (out / "claims.md").read_text()
        gaps = list(csv.DictReader((out / "claim_gaps.csv").open()))
        assert {g["verdict"] for g in gaps} == {
            "2": {"too few seeds"}, "1": {"reproduced"}}[min_seeds]
    assert "**too few seeds**" in verdicts["2"] and "**reproduced**" not in verdicts["2"]
    assert "**reproduced**" in verdicts["1"]
    results = (tmp_path / "report2" / "results.md").read_text()
    assert "fewer than 2 seeds" in results
    gap_row = next(ln for ln in results.split("## Claims over training")[1].splitlines()
                   if ln.startswith("| the lab beats GRPO |"))
    assert gap_row.count(" ?") == 3  # steps 0, 10 and 20


def test_arms_beyond_ten_colours_differ_in_line_style():
    """Eleven arms (the paper-findings study) drew A1 and A11 alike when only the colour
    cycled; every (colour, style) pair of 40 arms is distinct."""
    styles = [arm_style(i) for i in range(40)]
    assert len(set(styles)) == 40 and arm_style(0)[0] == arm_style(10)[0] != arm_style(1)[0]


def test_partial_arm_is_marked(tmp_path):
    """A running sweep: arm B's seed 1 has no summary and logged 10 of 20 steps."""
    rng = np.random.default_rng(4)
    questions = _questions(10, rng)
    root = tmp_path / "sweep"
    write_run(root / "0", ["advantage=grpo", "seed=0"], questions, 0.0, rng)
    write_run(root / "1", ["advantage=lab", "seed=0"], questions, 0.2, rng)
    write_run(root / "2", ["advantage=lab", "seed=1"], questions, 0.2, rng, steps=10, summary=False)
    out = tmp_path / "report"
    claims = _claims_file(tmp_path, {**CLAIM, "step": "common"})
    assert main([str(root), "--out", str(out), "--resamples", "200", "--no-plots",
                 "--claims", str(claims)]) == 0
    results = (out / "results.md").read_text()
    assert "step common (10)" in results  # the last eval every run of both arms reached
    assert "(partial arm)" in (out / "claims.md").read_text()
    assert "| A1 | advantage=grpo | 0 | 0 | 20 | complete |" in results
    assert "| A2 | advantage=lab | 1, 2 | 0, 1 | 20/10 | partial: 2 (no summary.json, 10 of 20 steps) |" in results
    final = next(ln for ln in results.splitlines() if ln.startswith("| A2 | 0."))
    assert final.endswith("| 10, 20 |")  # each seed's last eval
    pair = next(ln for ln in results.splitlines() if ln.startswith("| A1 | A2 |"))
    assert pair.startswith("| A1 | A2 | 10 |")  # the partial arm is compared where all runs were


def test_wandb_export_falls_back_to_seed_intervals(tmp_path):
    """history.csv + config.json per run, no trajectories: intervals over seeds only."""
    import pandas as pd

    for i, (arm, em) in enumerate([("grpo", 0.30), ("grpo", 0.32), ("lab", 0.50), ("lab", 0.52)]):
        run = tmp_path / "export" / f"run{i}"
        run.mkdir(parents=True)
        pd.DataFrame({"_step": [0, 10, 20], "_runtime": [1, 2, 3],
                      "eval/em/macro": [0.05, em - 0.1, em], "eval/em/world_1hop": [0.1, em, em],
                      "rollout/degenerate_group_rate": [None, 0.3, 0.4]}).to_csv(run / "history.csv")
        config = {"trainer": {"steps": 20}, "hydra": {"overrides": [f"advantage={arm}", f"seed={i}"]}}
        (run / "config.json").write_text(json.dumps(config))
        if i != 3:
            (run / "summary.json").write_text(json.dumps({"eval/em/macro": em}))
    out = tmp_path / "report"
    claims = _claims_file(tmp_path, CLAIM)
    assert main([str(tmp_path / "export"), "--out", str(out), "--claims", str(claims),
                 "--resamples", "200"]) == 0
    results = (out / "results.md").read_text()
    assert "| A1 | 0.310 [0.300, 0.320] † |" in results
    assert "run1 has no eval trajectories" in results or "run0 has no eval trajectories" in results
    assert "partial: run3 (no summary.json)" in results
    table = (out / "claims.md").read_text()
    assert "(seeds only)" in table and "**reproduced**" in table
    assert (out / "degenerate_groups.png").is_file()


def test_real_study_runs(tmp_path):
    """The world-learning study's raw files (no trajectories kept): seeds-only, partial arm marked."""
    from pathlib import Path

    study = Path("experiments") / "world_learning" / "runs"
    runs = next((p / study for p in Path(__file__).resolve().parents if (p / study).is_dir()), None)
    if runs is None:
        pytest.skip("experiments/world_learning/runs is not in this checkout")
    out = tmp_path / "report"
    assert main([str(runs), "--out", str(out), "--resamples", "200", "--no-plots"]) == 0
    results = (out / "results.md").read_text()
    assert "experiment=paper_grpo_world, rollout.mask_observations=false" in results
    assert "unmasked_s1 (no summary.json, 73 of 100 steps)" in results
    assert "Runs without any eval, left out: `sft_study`" in results


def test_pending_lists_a_claim_whose_arm_has_not_run_and_still_checks_the_rest(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", lift_b=0.25, seeds=(0, 1), n_per_source=20)
    later = {"claim": "PPO beats GRPO", "a": {"advantage": "grpo"}, "b": {"advantage": "ppo"},
             "direction": "b>a"}
    claims = _claims_file(tmp_path, CLAIM, later)
    out = tmp_path / "report"
    args = [str(sweep), "--out", str(out), "--claims", str(claims), "--resamples", "200", "--no-plots"]
    assert main(args) == 2  # without --pending a selector that matches nothing is an error
    assert main(args + ["--pending"]) == 0
    table = (out / "claims.md").read_text()
    row = next(ln for ln in table.splitlines() if ln.startswith("| PPO beats GRPO |"))
    assert "no run of advantage=ppo yet" in row and "**not run yet**" in row
    assert "| the lab beats GRPO |" in table and "**reproduced**" in table
    two = _claims_file(tmp_path, {**CLAIM, "a": {"trainer.steps": 20}})  # ambiguity stays fatal
    assert main([str(sweep), "--out", str(out), "--claims", str(two), "--resamples", "200",
                 "--no-plots", "--pending"]) == 2


@pytest.mark.parametrize("case", ["empty", "bad_summary", "bad_trajectories", "no_arm", "two_arms",
                                  "bad_claim"])
def test_bad_input_exits_2_with_one_paragraph(tmp_path, capsys, case):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    claims = []
    if case != "empty":
        write_sweep(sweep, lift_b=0.1, seeds=(0,), n_per_source=3, steps=0)
    if case == "bad_summary":
        (sweep / "0" / "summary.json").write_text("{not json")
    if case == "bad_trajectories":
        (sweep / "1" / "eval" / "step_000000" / "trajectories.jsonl").write_text("oops\n[1]\n")
    if case == "no_arm":
        claims = [{**CLAIM, "b": {"advantage": "ppo"}}]
    if case == "two_arms":
        claims = [{**CLAIM, "a": {"trainer.steps": 20}}]
    if case == "bad_claim":
        claims = [{**CLAIM, "direction": "up"}]
    args = [str(sweep), "--out", str(tmp_path / "out"), "--resamples", "100", "--no-plots"]
    if claims:
        args += ["--claims", str(_claims_file(tmp_path, *claims))]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("report: ") and "\n" not in err
    expected = {"empty": "no runs found", "bad_summary": "summary.json is malformed",
                "bad_trajectories": "no trajectory record", "no_arm": "which no arm has",
                "two_arms": "which 2 arms match", "bad_claim": "is not b>a or b<a"}[case]
    assert expected in err


def test_kept_study_runs_read_as_the_originals(tmp_path):
    """A study keeps slim, gzipped eval files (experiments/paper_findings/keep_runs.py): the
    report reads the same per-question rows from them as from the run's own files."""
    import gzip

    from searchr1.analysis.report.loading import ReportInputError, read_trajectories
    from tests.helpers.scripts import load_script

    keep = load_script("experiments/paper_findings/keep_runs.py")
    rng = np.random.default_rng(3)
    write_run(tmp_path / "study" / "a_s1", ["experiment=x", "seed=1"], _questions(5, rng), 0.2, rng)
    keep.keep_run(tmp_path / "study" / "a_s1", tmp_path / "kept" / "a_s1")
    kept_file = tmp_path / "kept" / "a_s1" / "eval" / "step_000020" / "trajectories.jsonl.gz"
    assert kept_file.is_file() and not kept_file.with_suffix("").exists()
    original, kept = load_runs([str(tmp_path / "study")]), load_runs([str(tmp_path / "kept")])
    assert sorted(original[0].questions) == sorted(kept[0].questions) == [0, 10, 20]
    for step, rows in original[0].questions.items():
        assert rows.equals(kept[0].questions[step])
    assert original[0].history.equals(kept[0].history)
    kept_file.write_bytes(gzip.compress(b"{}")[:-6])  # cut short
    with pytest.raises(ReportInputError, match="not a readable gzip file"):
        read_trajectories(kept_file)


def test_assume_joins_runs_made_before_a_default_changed(tmp_path):
    """Seed 0 ran before `model.lora_compute` existed; seed 1 pins the old value."""
    rng = np.random.default_rng(5)
    questions = _questions(3, rng)
    write_run(tmp_path / "s0", ["advantage=lab", "seed=0"], questions, 0.0, rng, steps=0)
    write_run(tmp_path / "s1", ["advantage=lab", "seed=1", "model.lora_compute=float32"], questions, 0.0,
              rng, steps=0)
    assert len(group_arms(load_runs([tmp_path]))) == 2
    arms = group_arms(load_runs([tmp_path], assume=["model.lora_compute=float32"]))
    assert len(arms) == 1 and sorted(r.seed for r in arms[0].runs) == [0, 1]
    # an explicit override wins over the assumption
    runs = load_runs([tmp_path], assume=["model.lora_compute=base"])
    assert {r.seed: r.overrides["model.lora_compute"] for r in runs} == {0: "base", 1: "float32"}


def test_runs_placed_differently_share_an_arm_and_other_overrides_split_it(tmp_path):
    """Two arms per GPU give each 0.48 of its memory, three give 0.32: still one arm."""
    rng = np.random.default_rng(6)
    questions = _questions(3, rng)
    write_run(tmp_path / "s1", ["advantage=lab", "seed=1", "engine.memory_fraction=0.48"], questions,
              0.0, rng, steps=0)
    write_run(tmp_path / "s2", ["advantage=lab", "seed=2", "engine.memory_fraction=0.32",
                                "trainer.resume=auto", "engine.admit_every=1", "engine.prefill_graphs=true",
                                "trainer.max_padded_tokens_per_microbatch=8000"], questions, 0.0, rng,
              steps=0)
    write_run(tmp_path / "s3", ["advantage=lab", "seed=3", "trainer.learning_rate=0.1"], questions,
              0.0, rng, steps=0)
    arms = group_arms(load_runs([tmp_path]))
    assert sorted(sorted(r.seed for r in a.runs) for a in arms) == [[1, 2], [3]]


def test_labels_leave_out_the_value_most_arms_share(tmp_path):
    """A baseline and its variants: each variant is labelled by what it changes, the baseline
    by all its telling keys, and the Arms section names the values left out. A 2 × 2 sweep,
    where no value is held by more than half the arms, keeps both axes in every label."""
    rng = np.random.default_rng(8)
    questions = _questions(3, rng)
    study = [("base", ["experiment=grpo", "rollout.group_size=8"]),
             ("g2", ["experiment=grpo", "rollout.group_size=2"]),
             ("lab", ["experiment=lab", "rollout.group_size=8"]),
             ("m1", ["experiment=grpo", "rollout.group_size=8", "rollout.max_searches=1"])]
    for name, overrides in study:
        write_run(tmp_path / "study" / name, [*overrides, "seed=1"], questions, 0.0, rng, steps=0)
    labels = {a.runs[0].label: a.label for a in group_arms(load_runs([tmp_path / "study"]))}
    assert labels == {"base": "experiment=grpo, rollout.group_size=8", "g2": "rollout.group_size=2",
                      "lab": "experiment=lab", "m1": "rollout.max_searches=1"}
    out = tmp_path / "report"
    assert main([str(tmp_path / "study"), "--out", str(out), "--resamples", "100", "--no-plots"]) == 0
    assert ("Labels leave out a key where the arm has the value most arms have: `experiment=grpo`, "
            "`rollout.group_size=8`.") in (out / "results.md").read_text()
    for g in (2, 4):
        for m in (1, 3):
            write_run(tmp_path / "sweep" / f"g{g}m{m}", [f"rollout.group_size={g}", f"rollout.max_searches={m}",
                                                         "seed=1"], questions, 0.0, rng, steps=0)
    labels = [a.label for a in group_arms(load_runs([tmp_path / "sweep"]))]
    assert labels == [f"rollout.group_size={g}, rollout.max_searches={m}" for g in (2, 4) for m in (1, 3)]
    assert main([str(tmp_path / "sweep"), "--out", str(out), "--resamples", "100", "--no-plots"]) == 0
    assert "Labels leave out" not in (out / "results.md").read_text()
