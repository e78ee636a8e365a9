"""Time the render of every table and figure from the cached runs (goal: under 60 s on 2 cores).

    python benchmarks/bench_render.py                    # in a fresh clone of this repository's HEAD
    python benchmarks/bench_render.py --repo /path/to/repo --profile smoke
    python benchmarks/bench_render.py --here             # in this working tree (rewrites its renders)

Prints the wall time of: the clone, Snakemake's dry run (must plan no training), the full render
(`snakemake --forcerun results tables figures -- results/P/summary.csv paper_tables figures`), and,
in process, the three steps it runs (gathering the runs, the tables, the figures).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    print(f"{label:<44} {time.perf_counter() - start:7.1f} s", flush=True)
    return out


def sh(args: list, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(map(str, args))} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(ROOT), help="repository to clone (default: this one)")
    ap.add_argument("--here", action="store_true", help="render in --repo itself instead of a fresh clone")
    ap.add_argument("--profile", default=None, help="profile to render (default: workflow/config/config.yaml's)")
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(args.repo)
        if not args.here:
            repo = Path(tmp) / "petra"
            timed("git clone", lambda: sh(["git", "clone", "-q", args.repo, repo], cwd=Path(tmp)))
        config = ["--config", f"profile={args.profile}"] if args.profile else []
        import yaml

        profile = args.profile or yaml.safe_load((repo / "workflow/config/config.yaml").read_text())["profile"]
        targets = ["--", f"results/{profile}/summary.csv", "paper_tables", "figures"]
        dry = timed("snakemake -n (plan)", lambda: sh([BIN / "snakemake", "-n", *config, *targets], cwd=repo))
        if "rule train:" in dry or "rule prepare:" in dry:
            sys.exit("the plan trains or prepares data: the cached runs are incomplete or look stale")
        timed(
            f"snakemake render ({args.cores} cores, profile {profile})",
            lambda: sh(
                [
                    BIN / "snakemake",
                    "--cores",
                    args.cores,
                    *config,
                    "--forcerun",
                    "results",
                    "tables",
                    "figures",
                    *targets,
                ],
                cwd=repo,
            ),
        )

        os.chdir(repo)
        from petra_core.report import figures, results, tables

        frames = timed(
            "  in process: gather runs (petra results)",
            lambda: results.collect(f"workflow/config/profiles/{profile}.yaml"),
        )
        out = Path(tmp) / "out"
        timed("  in process: write tables", lambda: results.write(frames, out / "results"))
        timed(
            "  in process: render tables (petra tables)",
            lambda: tables.render_all(out / "results", "results/costs", out / "tables", profile),
        )
        timed(
            "  in process: draw figures (petra figures)",
            lambda: figures.draw_all(out / "results", "results/costs", out / "figures", profile),
        )


if __name__ == "__main__":
    main()
