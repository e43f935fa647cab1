"""Command line of the study report (see the package docstring).

Writes into ``--out``: ``results.md``, the PNG plots and, with ``--claims``, ``claims.md``
(the claims table alone, to paste into a study's README), ``claim_gaps.csv`` and
``claim_gaps.png`` (each claim's B − A at every eval step: ``gaps``). Bad input — no runs,
a malformed file, a claims spec that selects no arm (unless ``--pending``) or several —
exits 2 with one paragraph saying what is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from searchr1.analysis.report import markdown as md
from searchr1.analysis.report.claims import check_claims, load_claims
from searchr1.analysis.report.gaps import all_gaps, write_csv
from searchr1.analysis.report.arms import baseline_arm, group_arms
from searchr1.analysis.report.loading import ReportInputError, has_eval, load_runs
from searchr1.analysis.report.measures import Settings, sources
from searchr1.analysis.report.plots import plot_claim_gaps, write_plots


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m searchr1.analysis.report",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="run folders, sweep folders or wandb export folders")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--claims", help="claims YAML (a list of comparisons)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap generator seed (0)")
    parser.add_argument("--level", type=float, default=0.95, help="interval level (0.95)")
    parser.add_argument("--collapse-fraction", type=float, default=0.5,
                        help="an eval below this × the best earlier eval is a collapse (0.5)")
    parser.add_argument("--min-seeds", type=int, default=2,
                        help="a claim whose interval excludes 0 is called 'too few seeds' while "
                             "an arm it compares has fewer seeds than this (2)")
    parser.add_argument("--no-plots", action="store_true", help="write only the markdown")
    parser.add_argument("--pending", action="store_true",
                        help="list a claim whose arm has no run yet as 'not run yet' instead of "
                             "exiting 2 (a running study's later arms)")
    parser.add_argument("--baseline", metavar="RUN",
                        help="compare every arm with the arm holding run RUN (its label in the "
                             "Arms table, e.g. grpo_s1) in the paired-differences table; without "
                             "it, every pair while arms are few, else the first arm with each")
    parser.add_argument("--assume", action="append", default=[], metavar="KEY=VALUE",
                        help="read runs that do not override KEY as if they set VALUE "
                             "(an option whose default changed during the study); repeatable")
    args = parser.parse_args(argv)
    if args.resamples < 100:
        parser.error("--resamples must be at least 100")
    if args.min_seeds < 1:
        parser.error("--min-seeds must be at least 1")
    if not 0.5 <= args.level < 1 or not 0 < args.collapse_fraction < 1:
        parser.error("--level must be in [0.5, 1) and --collapse-fraction in (0, 1)")
    return args


def build_report(args: argparse.Namespace) -> list[Path]:
    """Load, measure, write; returns the files written."""
    out = Path(args.out)
    runs = load_runs(args.paths, skip=[out], assume=args.assume)
    claims = load_claims(Path(args.claims)) if args.claims else []
    arms = group_arms([r for r in runs if has_eval(r)])
    if not arms:
        raise ReportInputError(f"none of the {len(runs)} runs found has an eval (no eval/* metrics "
                               "and no eval/step_<N>/trajectories.jsonl), so there is nothing to report.")
    settings = Settings(n_resamples=args.resamples, seed=args.seed, level=args.level,
                        collapse_fraction=args.collapse_fraction, min_seeds=args.min_seeds)
    baseline = baseline_arm(arms, args.baseline) if args.baseline else None
    results = check_claims(claims, arms, settings, pending=args.pending)
    gaps = all_gaps(results, settings)
    names = sources(arms)
    out.mkdir(parents=True, exist_ok=True)
    plots = [] if args.no_plots else write_plots(arms, names, out)
    if gaps and not args.no_plots and (gap_plot := plot_claim_gaps(gaps, out / "claim_gaps.png")):
        plots.append(gap_plot)
    sections = [md.header_section(args.paths, settings, len(runs)),
                md.arms_section(arms, [r for r in runs if not has_eval(r)]), md.time_section(arms),
                md.claims_section(results, settings), md.gaps_section(gaps, settings),
                md.final_section(arms, settings),
                md.source_section(arms, names, settings), md.pairs_section(arms, settings, baseline),
                md.curves_section(arms, settings),
                ["## Plots", "", *(f"![{p.stem}]({p.name})" for p in plots), ""] if plots else []]
    written = [md.write_markdown(out / "results.md", sections)]
    if results:
        written.append(md.write_markdown(out / "claims.md", [[md.claims_table(results, settings)]]))
    if gaps:
        written.append(write_csv(out / "claim_gaps.csv", gaps))
    return written + plots


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        written = build_report(args)
    except ReportInputError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
