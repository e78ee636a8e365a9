rule figures:
    """Figures of the selected profile (PNG and PDF): fig4_accumulation, training_curves,
    memory_per_stage, gradient_fidelity, budget_gap; and replica_rules (the cdp profile's runs,
    results/cdp), populations (the wash profile's, results/wash), acco (the acco profile's, results/acco) and
    cyclic (results/cyclic)."""
    input:
        summary=f"{RESULTS}/summary.csv",
        history=f"{RESULTS}/history.csv",
        memory=f"{RESULTS}/memory.csv",
        fidelity=f"{RESULTS}/fidelity.csv",
        costs=rules.costs.output,
        cyclic=rules.cyclic.output,
        replicas=REPLICAS,
        populations=POPULATIONS,
        acco=ACCO,
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
        results=lambda wildcards, input: os.path.dirname(input.summary),
        costs=lambda wildcards, input: os.path.dirname(input.costs[0]),
        cyclic=lambda wildcards, input: os.path.dirname(input.cyclic[0]),
        replicas=REPLICA_RESULTS,
        populations=POPULATION_RESULTS,
        acco=ACCO_RESULTS,
    shell:
        "petra figures --results {params.results:q} --costs {params.costs:q} --cyclic {params.cyclic:q} --replicas {params.replicas:q} --populations {params.populations:q} --acco {params.acco:q} --out {output:q} > {log:q} 2>&1"
