"""How long ``petra`` takes to answer: ``petra --help`` and a config typo (``petra train bad_key=1``).

A newcomer's first commands and every Snakemake rule start the CLI; it imports torch, torchvision
and pandas only inside the commands that need them (petra_core/cli.py), so these two should
answer in well under half a second. Prints the median wall time of N runs of each (a fresh
interpreter every time, as a shell would start it); no assertion, a machine's load varies.

    python benchmarks/bench_cli.py            # ~1 s
    python benchmarks/bench_cli.py --runs 9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["train", "bad_key=1"])


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "petra_core.cli", *argv], capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default %(default)s)")
    args = parser.parse_args()
    for argv in COMMANDS:
        times = [wall(argv) for _ in range(args.runs)]
        print(f"petra {' '.join(argv):<20} median {statistics.median(times):.3f} s of {args.runs} runs")


if __name__ == "__main__":
    main()
