rule figures:
    """Figures of the selected profile (PNG and PDF): fig4_accumulation, training_curves,
    memory_per_stage, gradient_fidelity, budget_gap; and every study's figures (workflow/studies/*.yaml:
    replica_rules, populations, acco, cyclic), from its own records."""
    input:
        summary=f"{RESULTS}/summary.csv",
        history=f"{RESULTS}/history.csv",
        memory=f"{RESULTS}/memory.csv",
        fidelity=f"{RESULTS}/fidelity.csv",
        costs=rules.costs.output,
        studies=STUDY_RECORDS,
        declarations=STUDY_FILES,
        code=REPORT_CODE,
    output:
        report(
            directory("figures"),
            patterns=["{name}.png"],
            caption="../report/figures.rst",
            category="Figures",
        ),
    conda:
        "../envs/petra.yaml"
    log:
        f"logs/{PROFILE}/figures.log",
    params:
        profile=PROFILE,
        studies=lambda wildcards, input: os.path.dirname(input.declarations[0]) if input.declarations else STUDIES_DIR,
        results=lambda wildcards, input: os.path.dirname(input.summary),
        costs=lambda wildcards, input: os.path.dirname(input.costs[0]),
    shell:
        "petra figures --results {params.results:q} --costs {params.costs:q} --studies {params.studies:q} --out {output:q} > {log:q} 2>&1"
