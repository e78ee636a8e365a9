rule train:
    """One run of the grid. `petra train` resumes from the run's checkpoint (checkpoints/..., not an
    output: it is large, git-ignored and versioned by DVC, see `petra store`). The outputs are
    small run records committed to git, so a clone has them; its inputs are ancient(), so a clone
    plans no training. `petra with-gpus` gives the run GPUs of its own (resource `gpu`), so
    `--resources gpu=4` runs four one-GPU runs side by side. `petra revision --check` first refuses
    a dirty revision or one not in main's history (config require_clean_revision), since the
    records name the revision that trained them."""
    input:
        unpack(train_inputs),
    output:
        multiext(f"{grid.RUN_DIR_PATTERN}/", *RECORDS),
    conda:
        "../envs/petra.yaml"
    log:
        "logs/{profile}/train/{dataset}/{model}/{run}.log",
    params:
        overrides=train_overrides,
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        command=train_command,
        settings=train_settings,
        check="petra revision --check &&" if REQUIRE_CLEAN_REVISION else "",
    threads: train_threads
    resources:
        gpu=train_resource("gpu"),
        mem_mb=train_resource("mem_mb"),
        runtime=train_resource("runtime"),
    shell:
        "( {params.check} petra with-gpus {resources.gpu} -- {params.command} --profile {input.profile:q} "
        "{params.overrides} --run-dir {params.run_dir:q} --checkpoint-dir {params.checkpoint_dir:q} ) > {log:q} 2>&1"
