"""Stage placement for the distributed runtime: which contiguous range of stages each rank owns.

Rank r owns ``placement[r]``, a ``range`` of stage indices. Ranges are contiguous, non-empty,
in rank order and cover every stage exactly once, so rank 0 always owns stage 0 (it reads the
data) and the last rank owns the head. Three ways to choose:

* ``"even"``      — equal stage counts (the first ranks get one more when J % N != 0);
* ``"balanced"``  — split measured per-stage costs so the slowest rank is as fast as possible
  (:func:`partition_contiguous`, exact dynamic programme over contiguous splits);
* explicit        — ``"0-3,4-9"`` (inclusive ranges, a lone index for one stage) or a list of
  ``range`` objects / ``(start, stop)`` pairs.

Everything here is a pure function (``balanced`` splits stage costs measured elsewhere:
:func:`petra_core.engine.stage_costs.measure_stage_costs`).
"""

from __future__ import annotations

from collections.abc import Sequence

PlacementSpec = str | Sequence[range] | Sequence[tuple[int, int]]


def check_placement(ranges: Sequence[range], num_stages: int, num_ranks: int) -> list[range]:
    """Validate a placement; returns it as a list of step-1 ranges or raises ValueError."""
    ranges = [r if isinstance(r, range) else range(*r) for r in ranges]
    if len(ranges) != num_ranks:
        raise ValueError(f"placement has {len(ranges)} stage ranges for {num_ranks} ranks: {format_placement(ranges)}")
    expected = 0
    for rank, r in enumerate(ranges):
        if r.step != 1 or len(r) == 0 or r.start != expected:
            raise ValueError(
                f"placement {format_placement(ranges)} is not a partition of stages 0-{num_stages - 1} into "
                f"contiguous non-empty ranges in rank order (rank {rank} should start at stage {expected})"
            )
        expected = r.stop
    if expected != num_stages:
        raise ValueError(
            f"placement {format_placement(ranges)} covers stages 0-{expected - 1}, the model has "
            f"{num_stages} (0-{num_stages - 1})"
        )
    return ranges


def format_stages(r: range) -> str:
    return f"stage {r.start}" if len(r) == 1 else f"stages {r.start}-{r.stop - 1}"


def format_placement(ranges: Sequence[range]) -> str:
    """Inverse of :func:`parse_placement`: ``"0-3,4-9"``."""
    return ",".join(str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}" for r in ranges)


def even_partition(num_stages: int, num_ranks: int) -> list[range]:
    """Equal stage counts; the first ``num_stages % num_ranks`` ranks get one more."""
    if not 1 <= num_ranks <= num_stages:
        raise ValueError(f"cannot place {num_stages} stages on {num_ranks} ranks (need 1 <= ranks <= stages)")
    base, extra = divmod(num_stages, num_ranks)
    ranges, start = [], 0
    for r in range(num_ranks):
        stop = start + base + (1 if r < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


def partition_contiguous(costs: Sequence[float], num_ranks: int) -> list[range]:
    """Split ``costs`` (one per stage) into ``num_ranks`` contiguous non-empty ranges minimising
    the largest range sum (the pipeline's tick time). Exact O(J²·N) dynamic programme.

    Ties between optimal splits are broken towards the smallest sum of squared range costs (the
    most even split), then towards earlier boundaries, so the result is deterministic.
    """
    J = len(costs)
    if not 1 <= num_ranks <= J:
        raise ValueError(f"cannot place {J} stages on {num_ranks} ranks (need 1 <= ranks <= stages)")
    if any(c < 0 for c in costs):
        raise ValueError(f"stage costs must be >= 0, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def seg(a: int, b: int) -> float:  # cost of stages a..b-1
        return prefix[b] - prefix[a]

    inf = (float("inf"), float("inf"))
    # best[p][i]: (max, sum of squares) for the first i stages on p ranks; cut[p][i]: start of the last range
    best = [[inf] * (J + 1) for _ in range(num_ranks + 1)]
    cut = [[0] * (J + 1) for _ in range(num_ranks + 1)]
    best[0][0] = (0.0, 0.0)
    for p in range(1, num_ranks + 1):
        for i in range(p, J - (num_ranks - p) + 1):
            for s in range(p - 1, i):
                prev = best[p - 1][s]
                if prev == inf:
                    continue
                c = seg(s, i)
                cand = (max(prev[0], c), prev[1] + c * c)
                if cand < best[p][i]:
                    best[p][i], cut[p][i] = cand, s
    ranges, i = [], J
    for p in range(num_ranks, 0, -1):
        s = cut[p][i]
        ranges.append(range(s, i))
        i = s
    return ranges[::-1]


def parse_placement(
    spec: PlacementSpec, num_stages: int, num_ranks: int, costs: Sequence[float] | None = None
) -> list[range]:
    """Turn a placement spec into validated ranges. ``"balanced"`` needs ``costs``."""
    if isinstance(spec, str):
        s = spec.strip()
        if s == "even":
            return even_partition(num_stages, num_ranks)
        if s == "balanced":
            if costs is None:
                raise ValueError("placement 'balanced' needs measured stage costs")
            if len(costs) != num_stages:
                raise ValueError(f"got {len(costs)} stage costs for {num_stages} stages")
            return partition_contiguous(costs, num_ranks)
        ranges = []
        for part in s.split(","):
            try:
                a, _, b = part.strip().partition("-")
                lo, hi = int(a), int(b) if b else int(a)
            except ValueError:
                raise ValueError(
                    f"bad placement {spec!r}: expected 'even', 'balanced' or ranges like '0-3,4-9'"
                ) from None
            ranges.append(range(lo, hi + 1))
        return check_placement(ranges, num_stages, num_ranks)
    return check_placement(list(spec), num_stages, num_ranks)
