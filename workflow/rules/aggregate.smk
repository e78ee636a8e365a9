rule results:
    """Gather every run of the profile into tidy tables: results.csv (one row per run: config,
    final metrics, parameters), history.csv (per epoch), memory.csv (per stage), fidelity.csv,
    summary.csv (mean, std, n over seeds) and metrics/GROUP.json (DVC metrics, a file per group)."""
    input:
        metrics=run_records("metrics.json"),  # each run's config.yaml and history.json come with it
        profile=PROFILE_FILE,
        code=REPORT_CODE,
    output:
        report(f"{RESULTS}/summary.csv", caption="../report/summary.rst", category="Results"),
        *(f"{RESULTS}/{name}" for name in RESULT_FILES if name != "summary.csv"),
        directory(f"{RESULTS}/{METRICS_DIR}"),
    conda:
        "../envs/petra.yaml"
    log:
        f"logs/{PROFILE}/results.log",
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "petra results --profile {input.profile:q} --out {params.out:q} > {log:q} 2>&1"


rule costs:
    """Measure Table 1 (every method in the engine, per stage), account Table 3 and track a
    gradient-fidelity sample. Profile-independent; the CSVs are committed, so a clone does not
    recompute them (no input files: an existing output is never stale)."""
    output:
        multiext(f"{COSTS}/", *COST_FILES),
    conda:
        "../envs/petra.yaml"
    log:
        "logs/costs.log",
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
        settings=json.dumps(config["costs"], sort_keys=True),
    threads: 1
    shell:
        "petra costs --out {params.out:q} --settings {params.settings:q} > {log:q} 2>&1"


# a measured study's records (workflow/studies/NAME.yaml, `measure`): its command writes them, once;
# committed, so a clone measures nothing (no input files: an existing output is never stale)
for study in MEASURED:

    rule:
        name:
            study.name
        output:
            multiext(f"{study.results}/", *study.records),
        conda:
            "../envs/petra.yaml"
        log:
            f"logs/{study.name}.log",
        params:
            command=study.measure_command(),
        threads: 1
        shell:
            "{params.command} > {log:q} 2>&1"
