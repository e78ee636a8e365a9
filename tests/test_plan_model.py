"""The planner's model: cluster cards, profiles, the event simulation against closed forms, memory."""

import json
import math
from dataclasses import replace

import pytest

from petra_core.plan.cluster import GIB, LOCAL, Link, PlanError, load_cluster, parse_cluster, shipped_clusters
from petra_core.plan.profile import DeviceProfile, StageProfile, check_profile, load_profile, save_profile
from petra_core.plan.simulate import Layout, parse_split, predict, replay, ring_allreduce_s


def profile(J, f=1.0, r=0.0, b=2.0, s=0.0, msg=0, method="petra", kept=10, weights=100):
    stage = StageProfile(f, r, b, s, weights, weights, weights, kept, msg, msg)
    return DeviceProfile("revnet18", method, 8, tuple(stage for _ in range(J)), provenance={"source": "test"})


CARD = {
    "name": "two-nodes",
    "device": {"name": "X", "memory_gib": 16},
    "nodes": 2,
    "devices_per_node": 2,
    "links": {
        "nvlink": {"latency_us": 1, "bandwidth_gb_s": 100, "efficiency": 0.5},
        "ib": {"latency_us": 10, "bandwidth_gb_s": 10},
    },
    "intra_node": "nvlink",
    "inter_node": "ib",
}


# ---- cards ---------------------------------------------------------------------------------------
def test_shipped_cards_load():
    names = shipped_clusters()
    assert {"h200-sxm-node", "h100-sxm-node", "a100-pcie-node", "8x1-100gbe", "cpu-box"} <= set(names)
    for name in names:
        c = load_cluster(name)
        assert c.devices >= 2 and c.memory_bytes > 0 and c.source


def test_card_links_within_and_across_nodes():
    c = parse_cluster(CARD, "t")
    assert c.devices == 4 and c.memory_bytes == 16 * GIB
    assert c.link(0, 1).name == "nvlink" and c.link(1, 2).name == "ib" and c.link(3, 3).latency_s == 0
    assert c.link(0, 1).seconds(50e9) == pytest.approx(1e-6 + 1.0)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"links": {"infiniband": {"latency_us": 1, "bandwidth_gb_s": 1}}}, "unknown link class 'infiniband'"),
        ({"intra_node": "pcie"}, "intra_node is 'pcie', not one of its links"),
        ({"device": {"name": "X", "memory_gib": -1}}, "device.memory_gib is -1"),
        ({"nodes": 0}, "nodes is 0"),
        (
            {"links": {"nvlink": {"latency_us": 1, "bandwidth_gb_s": 0}, "ib": {"latency_us": 1, "bandwidth_gb_s": 1}}},
            "bandwidth_gb_s is 0",
        ),
        ({"inter_node": None}, "inter_node is missing"),
        ({"gpus": 3}, "unknown key 'gpus'"),
    ],
)
def test_bad_cards_one_line(change, message):
    with pytest.raises(PlanError, match=message) as err:
        parse_cluster({**CARD, **change}, "t")
    assert "\n" not in str(err.value)


def test_unknown_cluster_name():
    with pytest.raises(PlanError, match="unknown cluster 'dgx-9'; allowed: .*h200-sxm-node"):
        load_cluster("dgx-9")


def test_unknown_device_on_cluster():
    with pytest.raises(PlanError, match="device 4 is not on cluster"):
        parse_cluster(CARD, "t").link(0, 4)


# ---- profiles ------------------------------------------------------------------------------------
def test_profile_round_trip(tmp_path):
    p = profile(3)
    path = save_profile(p, tmp_path / "p.json")
    assert load_profile(path) == p
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]  # no temporary file left


def test_profile_from_another_model_refused(tmp_path):
    with pytest.raises(PlanError, match="is of model 'revnet18', not 'revnet50'"):
        check_profile(profile(3), arch="revnet50")
    with pytest.raises(PlanError, match="has 3 stages, the plan asks for 10"):
        check_profile(profile(3), arch="revnet18", stages=10)
    (tmp_path / "bad.json").write_text(json.dumps({"format": 1}))
    with pytest.raises(PlanError, match="not a petra plan profile"):
        load_profile(tmp_path / "bad.json")


# ---- the simulation against closed forms ---------------------------------------------------------
@pytest.mark.parametrize("method", ["backprop", "delayed", "dsp", "petra", "gpipe", "1f1b"])
def test_one_device_is_the_sum_of_phases(method):
    p = profile(4, f=1.0, r=0.5, b=2.0, s=0.25)
    t = predict(p, method, placement=[range(4)], k=1).seconds_per_minibatch
    assert t == pytest.approx(4 * (1.0 + 0.5 + 2.0 + 0.25))


@pytest.mark.parametrize("method", ["delayed", "dsp", "petra"])
def test_pipelined_steady_state_is_the_slowest_stage(method):
    stages = tuple(StageProfile(f, 0.0, 2 * f, 0.1) for f in (1.0, 3.0, 2.0, 1.5))
    p = DeviceProfile("revnet18", method, 8, stages)
    pr = predict(p, method)
    assert pr.seconds_per_minibatch == pytest.approx(3.0 + 6.0 + 0.1)
    work = sum(3 * f + 0.1 for f in (1.0, 3.0, 2.0, 1.5))
    assert pr.bubble_fraction == pytest.approx(1 - work / (4 * 9.1))


def test_sequential_backprop_is_the_sum_over_devices():
    assert predict(profile(5), "backprop").seconds_per_minibatch == pytest.approx(5 * 3.0)


def test_host_time_is_charged_once_per_tick_a_stage_acts_in():
    """The engine's host seconds per tick (``host_s``): sequential backprop over J = 2 acts in 3 ticks a
    minibatch (stage 0's forward, stage 1's forward and backward, stage 0's backward), all on the
    critical path; a pipelined method's stages act every tick, so the slowest stage pays it once."""
    host = 0.25
    with_host = lambda p: DeviceProfile(**{**p._fields(), "stages": tuple(replace(s, host_s=host) for s in p.stages)})  # noqa: E731
    plain, busy = profile(2), with_host(profile(2))
    gap = predict(busy, "backprop").seconds_per_minibatch - predict(plain, "backprop").seconds_per_minibatch
    assert gap == pytest.approx(3 * host)
    stages = tuple(StageProfile(f, 0.0, 2 * f, 0.1, host_s=host) for f in (1.0, 3.0, 2.0, 1.5))
    assert predict(DeviceProfile("revnet18", "petra", 8, stages), "petra").seconds_per_minibatch == pytest.approx(
        3.0 + 6.0 + 0.1 + host
    )


@pytest.mark.parametrize("J, k", [(2, 1), (4, 4), (6, 8), (10, 3)])
def test_1f1b_bubble(J, k):
    """1F1B, balanced stages: a group of k microbatches takes k + J − 1 ticks of (f + b), a bubble of
    (J − 1) / (k + J − 1)."""
    pr = predict(profile(J, f=1.0, b=1.0), "1f1b", k=k)
    assert pr.seconds_per_minibatch == pytest.approx((k + J - 1) * 2.0 / k)
    assert pr.bubble_fraction == pytest.approx((J - 1) / (k + J - 1))


def test_gpipe_closed_form():
    """GPipe, k >= 2 microbatches a flush: the same (k + J − 1) ticks a group, (J − 1) / (k + J − 1)."""
    for J, k in [(2, 4), (4, 4), (4, 8)]:
        pr = predict(profile(J, f=1.0, b=2.0), "gpipe", k=k)
        assert pr.bubble_fraction == pytest.approx((J - 1) / (k + J - 1))
        assert pr.seconds_per_minibatch == pytest.approx((k + J - 1) * 3.0 / k)


def test_link_bound_pipeline():
    """Messages far longer than a stage's compute: the pipeline runs at the link's pace, bytes / bandwidth
    (each directed link carries one message a minibatch, back to back)."""
    link = Link("ethernet", latency_s=1e-3, bandwidth=1e9, efficiency=0.5)
    pr = predict(profile(4, f=0.01, b=0.02, msg=2.5e9), "petra", link=link)
    assert pr.seconds_per_minibatch == pytest.approx(2.5e9 / 0.5e9)
    assert pr.link_bytes_per_minibatch == pytest.approx(2 * 3 * 2.5e9)


def test_split_shares_devices():
    p = profile(4, f=1.0, b=2.0)
    pr = predict(p, "petra", placement=parse_split("0-1,2-3", 4))
    assert pr.devices == 2 and pr.seconds_per_minibatch == pytest.approx(6.0) and pr.speedup == pytest.approx(2.0)
    assert pr.peak_bytes[0] == sum(predict(p, "petra").peak_bytes[:2])


@pytest.mark.parametrize(
    "text, message", [("0-1,3", "should start at stage 2"), ("0-2", "covers stages 0-2"), ("0-a", "not a stage")]
)
def test_bad_splits(text, message):
    with pytest.raises(PlanError, match=message):
        parse_split(text, 4)


def test_replicas_all_reduce():
    link = Link("ib", latency_s=1e-3, bandwidth=1e9)
    p = profile(2, f=1.0, b=2.0, weights=int(1e9))
    one = predict(p, "petra", link=link)
    two = predict(p, "petra", replicas=2, link=link)
    ring = ring_allreduce_s(1e9, 2, link)
    assert ring == pytest.approx(2 * (1e-3 + 0.5))
    assert two.seconds_per_minibatch == pytest.approx(one.seconds_per_minibatch + ring)
    assert two.allreduce_bytes_per_step == pytest.approx(2 * 1e9)  # two stages, each (2(R-1)/R) × 1 GB
    assert two.samples_per_s == pytest.approx(2 * 8 / two.seconds_per_minibatch)


def test_memory_per_method_and_fit():
    card = parse_cluster({**CARD, "device": {"name": "X", "memory_gib": 1e-6}}, "t")
    p = profile(4, kept=1000, weights=100)
    petra = predict(p, "petra", cluster=card)
    delayed = predict(p, "delayed", cluster=card)
    # in flight at stage j: 2(J-1-j); delayed also stashes ceil(2(J-1-j)/k) weight copies
    assert petra.peak_bytes == [300 + 2 * (3 - j) * 1000 for j in range(4)]
    assert delayed.peak_bytes == [300 + 2 * (3 - j) * 1100 for j in range(3)] + [300]
    assert petra.fits is (max(petra.peak_bytes) <= 1e-6 * GIB)


@pytest.mark.parametrize("method, k", [("petra", 1), ("1f1b", 4), ("backprop", 1)])
def test_epoch_time_extrapolates_the_steady_state(method, k):
    """An epoch is the replay of its first minibatches plus the steady state for the rest: the same as
    replaying every minibatch of it."""
    p = profile(4, f=1.0, r=0.5, b=2.0, s=0.1)
    pr = predict(p, method, k=k, minibatches_per_epoch=1000)
    layout = Layout(tuple(range(j, j + 1) for j in range(4)))
    whole = replay(p, method, layout, lambda a, b: LOCAL, k=k, minibatches=1000).makespan
    assert pr.seconds_per_epoch == pytest.approx(whole, rel=1e-9)
    assert math.isclose(pr.speedup, pr.one_device_seconds / pr.seconds_per_minibatch)
