# PETRA reproducibility pipeline: train every run of an experiment profile's grid, gather the runs
# into one tidy results table, render the paper's Tables 1-3 and the figures from it.
#
#   .venv/bin/snakemake --cores all figures/ paper_tables/       # render from the cached runs
#   .venv/bin/snakemake --cores all --config profile=smoke       # the smoke grid, end to end
#   .venv/bin/snakemake --report report.html                     # HTML report of tables and figures
#
# The grid lives in workflow/config/profiles/PROFILE.yaml only (read through petra_core.workflow.grid),
# each study in workflow/studies/NAME.yaml only (petra_core.workflow.studies); see docs/reproducing.md.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "workflow/config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# rules find `petra` through PATH (common.smk puts the running interpreter's bin directory first) and
# run this checkout's code through PYTHONPATH (common.smk puts the checkout first); declared after
# common.smk sets them, so that a cluster job gets them too
envvars:
    "PATH",
    "PYTHONPATH",


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/figures.smk"


localrules:
    all,
    results,
    tables,
    figures,


rule all:
    input:
        all_targets(),
    default_target: True
