"""Report: the paper's tables and figures from the tidy results table only.

``results`` gathers a profile's run records into tidy tables; ``costs`` reads the measured
Tables 1 and 3 (written by ``petra costs``, accounting); ``tables`` renders Tables 1–3 with
Jinja2 beside the paper's numbers (``petra_core.reference``, the one place they live);
``figures`` draws the figures with seaborn. ``commands`` adds ``petra results | tables |
figures``; the Snakemake rules in ``workflow/rules/`` call those commands. Nothing here imports
the engine or the models: the report only reads records.
"""
