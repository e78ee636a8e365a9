"""The planner's searches: best split (exact DP against brute force), fewest devices, largest RevNet."""

import itertools

import pytest

from petra_core.plan.cluster import GIB, Link, PlanError, parse_cluster
from petra_core.plan.memory import stage_peak_bytes
from petra_core.plan.profile import DeviceProfile, StageProfile
from petra_core.plan.search import best_split, largest_revnet, min_devices, scan_devices, sized_profile


def splits(J, G):
    for cuts in itertools.combinations(range(1, J), G - 1):
        bounds = (0, *cuts, J)
        yield [range(a, b) for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("G", [1, 2, 3, 5])
def test_best_split_under_a_cap_is_the_brute_force_optimum(G):
    costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    memory = [5, 1, 2, 7, 1, 8, 2, 8]
    for cap in (8, 10, 15, 100):
        fits = [s for s in splits(8, G) if all(sum(memory[j] for j in r) <= cap for r in s)]
        got = best_split(costs, G, memory, cap)
        if not fits:
            assert got is None
            continue
        best = min(max(sum(costs[j] for j in r) for r in s) for s in fits)
        assert max(sum(costs[j] for j in r) for r in got) == best
        assert all(sum(memory[j] for j in r) <= cap for r in got)


def test_best_split_without_a_cap_is_the_engines_balanced_placement():
    from petra_core.engine.placement import partition_contiguous

    costs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert best_split(costs, 3) == partition_contiguous(costs, 3)
    with pytest.raises(PlanError, match="cannot split 5 stages over 6 devices"):
        best_split(costs, 6)


def uniform(J, weights=100, kept=1000):
    s = StageProfile(1.0, 0.0, 2.0, 0.0, weights, weights, weights, kept, 0, 0)
    return DeviceProfile("revnet18", "petra", 8, tuple(s for _ in range(J)))


def test_min_devices():
    p = uniform(4)
    peaks = stage_peak_bytes(p.stages, "petra")  # 300 + 2(3-j) * 1000: 6300, 4300, 2300, 300
    assert min_devices(p, "petra", sum(peaks)) == (1, [range(0, 4)])
    g, split = min_devices(p, "petra", 6600)
    assert g == 3 and all(sum(peaks[j] for j in r) <= 6600 for r in split)
    assert min_devices(p, "petra", 6000) is None  # stage 0 alone holds 6300


def test_memory_cap_below_a_stages_weights_is_one_line():
    with pytest.raises(PlanError, match="memory cap .* is below stage 0's weights, gradients and optimizer state"):
        min_devices(uniform(4, weights=10 * GIB), "petra", 20 * GIB)


def test_scan_devices_picks_the_fastest_pipeline_times_replicas():
    out = scan_devices(uniform(4), "petra", 9)
    assert [pr.devices for pr in out] == list(range(1, 10))
    # free links: every P x R = G runs at G / 1 device's speed; the ties go to the first (P = 1)
    assert [pr.samples_per_s for pr in out] == pytest.approx([g * 8 / 12.0 for g in range(1, 10)])
    slow = Link("slow", 0.0, 1.0)  # all-reduce of 100 bytes: 100 s per step for two replicas
    out = scan_devices(uniform(4), "petra", 8, link=slow)
    assert (out[3].replicas, out[3].split) == (1, "0,1,2,3") and out[7].replicas == 2


def test_sized_profile_bytes_scale_with_batch():
    a = sized_profile("revnet18", 16, "dsp", batch=4, stem="cifar")
    b = sized_profile("revnet18", 16, "dsp", batch=8, stem="cifar")
    assert [s.weight_bytes for s in a.stages] == [s.weight_bytes for s in b.stages]
    assert [2 * s.kept_bytes for s in a.stages] == [s.kept_bytes for s in b.stages]


def test_largest_revnet_grows_with_memory_and_petra_fits_more_than_delayed():
    card = {"name": "t", "device": {"name": "X", "memory_gib": 0.5}, "nodes": 1, "devices_per_node": 4,
            "links": {"nvlink": {"latency_us": 1, "bandwidth_gb_s": 100}}, "intra_node": "nvlink"}  # fmt: skip
    small, big = parse_cluster(card, "t"), parse_cluster({**card, "device": {"name": "X", "memory_gib": 4}}, "t")
    widths = (16, 32, 64, 128)
    found = {
        (m, c.memory_bytes): largest_revnet(c, m, batch=8, stem="cifar", depths=("revnet18",), widths=widths)
        for m in ("petra", "delayed")
        for c in (small, big)
    }
    assert found["delayed", big.memory_bytes]["params"] > found["delayed", small.memory_bytes]["params"]
    assert found["petra", small.memory_bytes]["params"] > found["delayed", small.memory_bytes]["params"]
    assert found["petra", small.memory_bytes]["peak_bytes"] <= small.memory_bytes
