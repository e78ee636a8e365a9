rule tables:
    """Tables 1-3 (Markdown and LaTeX booktabs) of the selected profile, ours beside the paper's:
    paper_tables/table1_costs, table2_accuracy, table3_memory, budget_gap (.md, .tex), Table 1's
    GPU section (results/gpu/*.json, benchmarks/bench_gpu.py, with the evidence in results/gpu/<GPU>/);
    and every study's tables (workflow/studies/*.yaml: replica_rules, populations, acco, cyclic),
    from its own records."""
    input:
        summary=f"{RESULTS}/summary.csv",
        results=f"{RESULTS}/results.csv",
        costs=rules.costs.output,
        gpu=GPU_FILES,
        gpu_evidence=GPU_EVIDENCE,
        reference=REFERENCE,
        templates=TEMPLATES,
        studies=STUDY_RECORDS,
        declarations=STUDY_FILES,
        code=REPORT_CODE,
    output:
        report(
            directory("paper_tables"),
            patterns=["{name}.md"],
            caption="../report/tables.rst",
            category="Tables",
        ),
    conda:
        "../envs/petra.yaml"
    log:
        f"logs/{PROFILE}/tables.log",
    params:
        profile=PROFILE,
        studies=lambda wildcards, input: os.path.dirname(input.declarations[0]) if input.declarations else STUDIES_DIR,
        results=lambda wildcards, input: os.path.dirname(input.summary),
        costs=lambda wildcards, input: os.path.dirname(input.costs[0]),
        gpu=lambda wildcards, input: os.path.dirname(input.gpu[0]) if input.gpu else GPU_RESULTS,
    shell:
        "petra tables --results {params.results:q} --costs {params.costs:q} --studies {params.studies:q} --gpu {params.gpu:q} --out {output:q} > {log:q} 2>&1"
