"""Planned profiles (workflow/config/planned/): grids being trained load as profiles, and one that
grows a committed profile keeps every run of it unchanged, so the records already committed
stay the records of the grown grid."""

from pathlib import Path

import pytest

from petra_core.workflow import grid

ROOT = Path(__file__).resolve().parents[1]
PLANNED = sorted((ROOT / "workflow" / "config" / "planned").glob("*.yaml"))


@pytest.mark.parametrize("path", PLANNED, ids=lambda p: p.stem)
def test_a_planned_profile_loads_and_names_distinct_runs(path):
    profile = grid.load_profile(path)
    assert profile["profile"] == path.stem, "a profile's name is its file's name"
    dirs = [r.directory for r in grid.runs(profile)]
    assert dirs and len(set(dirs)) == len(dirs), "every run of a profile has its own directory"


@pytest.mark.parametrize(
    "path", [p for p in PLANNED if (ROOT / "workflow/config/profiles" / p.name).exists()], ids=lambda p: p.stem
)
def test_a_grown_profile_keeps_every_committed_run_unchanged(path):
    committed = {
        r.directory: r.config for r in grid.runs(grid.load_profile(ROOT / "workflow/config/profiles" / path.name))
    }
    grown = {r.directory: r.config for r in grid.runs(grid.load_profile(path))}
    missing = sorted(set(committed) - set(grown))
    assert not missing, f"the planned profile drops committed runs: {missing}"
    changed = sorted(d for d in committed if committed[d] != grown[d])
    assert not changed, f"the planned profile changes committed runs: {changed}"
    assert len(grown) > len(committed), "a planned profile that adds nothing belongs in profiles/"
