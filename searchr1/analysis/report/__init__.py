"""The study report: runs or sweep folders → ``results.md`` with bootstrap intervals, PNG plots
and, from a claims spec, the "paper claim → world result → reproduced / not" table.

    python -m searchr1.analysis.report outputs/multirun/2026-11-29/20-05-17 --out reports/sweep
    python -m searchr1.analysis.report RUNS... --out DIR --claims claims.yaml

Modules: ``loading`` (run folders, running sweeps, wandb exports → runs and arms),
``bootstrap`` (hierarchical, paired and seeds-only intervals, verdicts), ``measures``
(metrics at a step, learning-curve figures), ``claims`` (the spec), ``plots``,
``markdown`` and ``__main__`` (the command line).
"""
