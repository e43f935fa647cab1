"""The study report: runs or sweep folders → ``results.md`` with bootstrap intervals, PNG plots
and, from a claims spec, the "paper claim → world result → reproduced / not" table.

    python -m searchr1.analysis.report outputs/multirun/2026-11-29/20-05-17 --out reports/sweep
    python -m searchr1.analysis.report RUNS... --out DIR --claims claims.yaml --baseline grpo_s1

Modules: ``loading`` (run folders, running sweeps, wandb exports → runs), ``arms`` (runs →
arms and their labels), ``bootstrap`` (hierarchical, paired and seeds-only intervals,
verdicts), ``measures`` (metrics at a step, B − A between arms or within one, learning-curve
figures), ``claims`` (the spec: two arms, or one arm measured twice),
``curves`` (learning-curve figures as claim metrics, with intervals), ``gaps`` (each
claim's difference at every eval step), ``timing`` (each arm's step, eval and wall times),
``plots``, ``markdown`` and ``__main__`` (the command line).

A wandb export (format in ``loading``) of one group, written with wandb's own client:

    for run in wandb.Api().runs("ENTITY/PROJECT", filters={"group": GROUP}):
        folder = Path("export", run.id); folder.mkdir(parents=True)
        run.history(samples=100_000, pandas=True).to_csv(folder / "history.csv")
        (folder / "config.json").write_text(json.dumps(dict(run.config), default=str))
        if run.state == "finished":
            (folder / "summary.json").write_text(json.dumps(dict(run.summary), default=str))

Without per-question files the page's intervals are over seeds only, and it says so.
"""
