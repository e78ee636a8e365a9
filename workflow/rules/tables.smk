rule tables:
    """Tables 1-3 (Markdown and LaTeX booktabs) of the selected profile, ours beside the paper's:
    paper_tables/table1_costs, table2_accuracy, table3_memory, budget_gap (.md, .tex); and
    replica_rules (the cdp profile's runs, results/cdp), populations (the wash profile's, results/wash), acco (the acco profile's, results/acco), cyclic
    (results/cyclic) and Table 1's
    GPU section (results/gpu/*.json, benchmarks/bench_gpu.py)."""
    input:
        summary=f"{RESULTS}/summary.csv",
        results=f"{RESULTS}/results.csv",
        costs=rules.costs.output,
        cyclic=rules.cyclic.output,
        replicas=REPLICAS,
        populations=POPULATIONS,
        acco=ACCO,
        gpu=GPU_FILES,
        reference=REFERENCE,
        templates=TEMPLATES,
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
        results=lambda wildcards, input: os.path.dirname(input.summary),
        costs=lambda wildcards, input: os.path.dirname(input.costs[0]),
        cyclic=lambda wildcards, input: os.path.dirname(input.cyclic[0]),
        replicas=REPLICA_RESULTS,
        populations=POPULATION_RESULTS,
        acco=ACCO_RESULTS,
        gpu=GPU_RESULTS,
    shell:
        "petra tables --results {params.results:q} --costs {params.costs:q} --cyclic {params.cyclic:q} --replicas {params.replicas:q} --populations {params.populations:q} --acco {params.acco:q} --gpu {params.gpu:q} --out {output:q} > {log:q} 2>&1"
