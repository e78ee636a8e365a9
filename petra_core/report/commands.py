"""``petra results | costs | tables | figures``: the report's sub-commands (picked up by ``petra_core.cli``).

Heavy imports (pandas, seaborn, the accounting) happen inside the commands, so ``petra --help``
stays fast and a missing plotting library only affects ``petra figures``.
"""
from __future__ import annotations

import json
from pathlib import Path


def _profile_name(path: str) -> str:
    from ..grid import load_profile

    return load_profile(path)["profile"]


def cmd_results(args) -> int:
    from . import results

    frames = results.collect(args.profile, root=args.root, allow_missing=args.allow_missing)
    for path in results.write(frames, args.out):
        print(path)
    return 0


def cmd_costs(args) -> int:
    from . import costs

    settings = json.loads(args.settings) if args.settings else None
    for path in costs.write(costs.measure(settings), args.out):
        print(path)
    return 0


def cmd_tables(args) -> int:
    from .tables import render_all

    for path in render_all(args.results, args.costs, args.out, profile=Path(args.results).name):
        print(path)
    return 0


def cmd_figures(args) -> int:
    from .figures import draw_all

    for path in draw_all(args.results, args.costs, args.out, profile=Path(args.results).name):
        print(path)
    return 0


def register(sub) -> None:
    p = sub.add_parser("results", help="gather a profile's runs into tidy tables (results/PROFILE/*.csv)",
                       description="Read every run of the profile's grid and write results.csv (one row per run), "
                                   "history.csv (per epoch), memory.csv (per stage), fidelity.csv, summary.csv "
                                   "(mean, std, n over seeds) and summary.json (DVC metrics).")
    p.add_argument("--profile", required=True, help="workflow/config/profiles/NAME.yaml")
    p.add_argument("--out", required=True, help="output directory, e.g. results/NAME")
    p.add_argument("--root", default=".", help="repository root the runs/ paths are relative to")
    p.add_argument("--allow-missing", action="store_true", help="leave out runs not finished yet")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("costs", help="measure Table 1 and Table 3 (and a fidelity sample) into CSVs",
                       description="Run every method a few minibatches under the accounting recorder (Table 1), "
                                   "account Table 3 by shape propagation, track a fidelity sample; write CSVs.")
    p.add_argument("--out", required=True, help="output directory, e.g. results/costs")
    p.add_argument("--settings", help="JSON overriding petra_core.report.costs.DEFAULTS, "
                                      "e.g. '{\"table1\": {\"image_size\": 64}}'")
    p.set_defaults(func=cmd_costs)

    for name, func, what in (("tables", cmd_tables, "render Tables 1-3 (Markdown and LaTeX) with the paper's values"),
                             ("figures", cmd_figures, "draw the figures (PNG and PDF)")):
        p = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument("--results", required=True, help="a profile's results directory, e.g. results/cpu")
        p.add_argument("--costs", default="results/costs", help="cached cost measurements (petra costs)")
        p.add_argument("--out", required=True, help="output directory")
        p.set_defaults(func=func)
