rule results:
    """Gather every run of the profile into tidy tables: results.csv (one row per run: config,
    final metrics, parameters), history.csv (per epoch), memory.csv (per stage), fidelity.csv,
    summary.csv (mean, std, n over seeds) and summary.json (DVC metrics)."""
    input:
        metrics=run_records("metrics.json"),  # each run's config.yaml and history.json come with it
        profile=PROFILE_FILE,
        code=REPORT_CODE,
    output:
        report(f"{RESULTS}/summary.csv", caption="../report/summary.rst", category="Results"),
        *(f"{RESULTS}/{name}" for name in RESULT_FILES if name != "summary.csv"),
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


rule cyclic:
    """Cyclic execution measured in the simulator (Cyclic Data Parallelism against DP): activation
    and gradient bytes of every time slot, their peaks and means over one step, and the devices
    each schedule needs. Profile-independent and committed, like the costs (no input files)."""
    output:
        multiext(f"{CYCLIC}/", *CYCLIC_FILES),
    conda:
        "../envs/petra.yaml"
    log:
        "logs/cyclic.log",
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
    threads: 1
    shell:
        "petra cyclic --out {params.out:q} > {log:q} 2>&1"
