"""Write dvc.yaml from the study registry (generated; never edited), like dvc_params.py writes params.yaml.

A study declared in workflow/studies/ (petra_core.workflow.studies) becomes a dependency of the
`render` stage, and a measured one a stage of its own (petra_core.workflow.dvc_stages).

    .venv/bin/python workflow/scripts/dvc_yaml.py            # write dvc.yaml
    .venv/bin/python workflow/scripts/dvc_yaml.py --check    # exit 1 if dvc.yaml is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from petra_core.workflow import dvc_stages, studies
from petra_core.workflow.generated import write_or_check

OUT = Path("dvc.yaml")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", default=str(studies.STUDIES_DIR), help="the study registry (default %(default)s)")
    ap.add_argument("--out", default=str(OUT), help="the file to write or check (default %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = ap.parse_args(argv)
    out, declared = Path(args.out), studies.load_all(args.studies)
    return write_or_check(
        out,
        dvc_stages.render(declared, args.studies),
        check=args.check,
        stale=f"{out} is stale for the studies of {args.studies}: run python workflow/scripts/dvc_yaml.py",
        wrote=f"{out}: {len(declared)} studies of {args.studies}",
    )


if __name__ == "__main__":
    sys.exit(main())
