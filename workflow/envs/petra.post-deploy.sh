#!/usr/bin/env bash
# Run by Snakemake inside the new conda environment, from the repository root: install petra.
set -euo pipefail
python -m pip install --no-deps -e .
