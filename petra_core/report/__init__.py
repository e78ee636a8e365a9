"""Report: the paper's tables and figures from the tidy results table only.

``results`` gathers a profile's run directories into tidy tables; ``costs`` caches the measured
Tables 1 and 3; ``tables`` renders Tables 1–3 with Jinja2 beside the paper's numbers
(``paper_reference.yaml``, the one place they live); ``figures`` draws the figures with seaborn.
``commands`` adds ``petra results | costs | tables | figures``. The Snakemake rules in
``workflow/rules/`` call those commands.
"""
from .reference import REFERENCE_FILE, load_paper_reference

__all__ = ["REFERENCE_FILE", "load_paper_reference"]
