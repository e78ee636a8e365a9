"""``petra results | tables | figures | studies | readme | plot``: the report's sub-commands
(picked up by ``petra_core.cli``).

Heavy imports (pandas, seaborn, the accounting) happen inside the commands, so ``petra --help``
stays fast and a missing plotting library only affects ``petra figures``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..run.runio import GPU_RESULTS
from ..workflow.studies import STUDIES_DIR


def study_dirs(pairs: list[str]) -> dict[str, str]:
    """``--study NAME=DIR`` options as {name: directory}."""
    out = {}
    for pair in pairs:
        name, sep, directory = pair.partition("=")
        if not sep or not name or not directory:
            raise ValueError(f"--study {pair!r}: expected NAME=DIR (a study of the registry and its results directory)")
        out[name] = directory
    return out


def cmd_results(args) -> int:
    from . import results

    def say(msg: str) -> None:
        print(f"petra results: {msg}", file=sys.stderr)

    frames = results.collect(args.profile, root=args.root, allow_missing=args.allow_missing, log=say)
    for path in results.write(frames, args.out):
        print(path)
    for line in results.summary_lines(results.summarize(frames["results"])):
        print(line)
    return 0


def cmd_tables(args) -> int:
    from .tables import render_all

    for path in render_all(
        args.results,
        args.costs,
        args.out,
        profile=Path(args.results).name,
        gpu_dir=args.gpu,
        studies_dir=args.studies,
        study_dirs=study_dirs(args.study),
    ):
        print(path)
    return 0


def cmd_figures(args) -> int:
    from .figures import draw_all

    for path in draw_all(
        args.results,
        args.costs,
        args.out,
        profile=Path(args.results).name,
        studies_dir=args.studies,
        study_dirs=study_dirs(args.study),
    ):
        print(path)
    return 0


def cmd_studies(args) -> int:
    """One line per declared study: where its records are and what it renders."""
    from ..workflow.studies import load_all

    for study in load_all(args.studies):
        source = f"profile {study.profile}" if study.profile else f"measured by `{study.measure_command()}`"
        outputs = ", ".join([*(f"table {t}" for t in study.tables), *(f"figure {f}" for f in study.figures)])
        outputs = (outputs or "no tables or figures of its own") + ("; a README part" if study.readme else "")
        print(f"{study.name}: {study.about} — {study.results} ({source}); {outputs}")
    return 0


def cmd_readme(args) -> int:
    from .readme import cmd_readme as run

    return run(args)


def cmd_plot(args) -> int:
    from .run_plot import cmd_plot as run

    return run(args)


def register(sub) -> None:
    p = sub.add_parser(
        "results",
        help="gather a profile's runs into tidy tables (results/PROFILE/*.csv)",
        description="Read every run of the profile's grid and write results.csv (one row per run), "
        "history.csv (per epoch), memory.csv (per stage), fidelity.csv, summary.csv "
        "(mean, std, n over seeds) and metrics/GROUP.json (DVC metrics: top-1 mean, std, n; a language model's "
        "test loss and bits per character; a file per group of runs, so `dvc metrics show` prints a row each); "
        "then print the paths and a line per group: top-1/top-5, or test loss, bits per character and perplexity.",
    )
    p.add_argument(
        "--profile", required=True, help="a profile, by name (cpu) or path (workflow/config/profiles/cpu.yaml)"
    )
    p.add_argument("--out", required=True, help="output directory, e.g. results/NAME")
    p.add_argument("--root", default=".", help="repository root the runs/ paths are relative to")
    p.add_argument("--allow-missing", action="store_true", help="leave out runs not finished yet (named on stderr)")
    p.set_defaults(func=cmd_results)

    for name, func, what in (
        (
            "tables",
            cmd_tables,
            "render the paper's tables (1-3, the budget gap) and every study's, Markdown and LaTeX, "
            "our values beside the paper's",
        ),
        ("figures", cmd_figures, "draw the profile's figures and every study's (PNG and PDF)"),
    ):
        p = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument("--results", required=True, help="a profile's results directory, e.g. results/cpu")
        p.add_argument("--costs", default="results/costs", help="cached cost measurements (petra costs)")
        p.add_argument(
            "--studies",
            default=str(STUDIES_DIR),
            help="the study registry: every study declared there adds its tables and figures (default %(default)s)",
        )
        p.add_argument(
            "--study",
            action="append",
            default=[],
            metavar="NAME=DIR",
            help="read study NAME's records from DIR instead of its declared results directory (repeatable)",
        )
        if name == "tables":
            p.add_argument(
                "--gpu",
                default=GPU_RESULTS,
                help="bench_gpu.py's files, rendered in Table 1's GPU section (default %(default)s)",
            )
        p.add_argument("--out", required=True, help="output directory")
        p.set_defaults(func=func)

    p = sub.add_parser(
        "studies",
        help="list the declared studies (workflow/studies/NAME.yaml): records, tables, figures",
        description="List the study registry: each study's records directory, how they are made "
        "(a profile's runs, or a command) and the tables and figures it renders.",
    )
    p.add_argument("--studies", default=str(STUDIES_DIR), help="the study registry (default %(default)s)")
    p.set_defaults(func=cmd_studies)

    p = sub.add_parser(
        "readme",
        help="render README.md's and docs/reproducing.md's generated blocks from the committed records",
        description="Replace the block between README.md's results markers by a render of "
        "results/costs and of each study's results (the studies of --studies with a readme part), "
        "and the block between its benchmarks markers by a render "
        "of results/benchmarks/*.json (benchmarks run with --record), the block between its gpu markers by a "
        "render of results/gpu/ (bench_gpu.py's files and each GPU's folder of evidence), and the expected "
        "values of --doc (docs/reproducing.md) likewise; --check: exit 1 if a committed block of either differs.",
    )
    p.add_argument("--readme", default="README.md", help="the file holding the blocks (default %(default)s)")
    p.add_argument(
        "--doc",
        default="docs/reproducing.md",
        help="the document whose expected values are generated blocks too (default %(default)s)",
    )
    p.add_argument("--results", default="results", help="the results root (default %(default)s)")
    p.add_argument("--studies", default=str(STUDIES_DIR), help="the study registry (default %(default)s)")
    p.add_argument("--check", action="store_true", help="only check; change nothing")
    p.set_defaults(func=cmd_readme)

    p = sub.add_parser(
        "plot",
        help="draw loss, accuracy and lr against epoch for one or several runs, from their history.json",
        description="Draw training loss, accuracy and learning rate (and test loss and top-1 where a run "
        "evaluated) against epoch, one line per run labelled by its run directory, from each RUN_DIR's "
        "history.json, into one PNG or PDF.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's directory (history.json)")
    p.add_argument("--out", required=True, help="the file to write: FILE.png or FILE.pdf")
    p.set_defaults(func=cmd_plot)
