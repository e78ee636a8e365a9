"""Emulated devices (engine/emulation.py) and the measured point (plan/measure.py): padding and link
delays against their closed forms, no bit changed by them, and bad input in one line."""

import time
from types import SimpleNamespace

import pytest
import torch
from conftest import make_batches, make_model

from petra_core import Simulator
from petra_core.engine.emulation import Link, LinkDelay, PhasePadding, RingDelay, check_phase_seconds
from petra_core.plan.measure import EmulatedPoint, chain_model, measure_point, message_delays, steady_margin


def test_messages_serialise_on_a_link_and_arrive_latency_after_their_transfer():
    delay = LinkDelay(Link(latency=0.01, bandwidth=1000.0))  # 1 KB/s: 100 bytes take 0.1 s
    assert delay.due(5.0, 100) == pytest.approx(5.11)
    assert delay.due(5.0, 100) == pytest.approx(5.21)  # sent at the same time: waits for the first
    assert delay.due(9.0, 50) == pytest.approx(9.06)  # the link was idle again
    assert Link(0.002, 1e9).seconds(10**6) == pytest.approx(0.003)


def test_a_replica_ring_costs_the_planners_ring_and_its_collectives_serialise():
    from petra_core.plan.cluster import Link as PlanLink
    from petra_core.plan.simulate import ring_allreduce_s

    ring = RingDelay(Link(latency=0.01, bandwidth=1000.0), size=4)  # 4 copies: 3 hops each way
    assert ring.seconds("all_reduce", 400) == pytest.approx(6 * (0.01 + 0.1))
    assert ring.seconds("reduce_scatter", 400) == ring.seconds("all_gather", 400) == pytest.approx(3 * 0.11)
    planned = PlanLink("emulated", 0.01, 1000.0)
    assert ring.seconds("all_reduce", 400) == pytest.approx(ring_allreduce_s(400, 4, planned))
    assert ring.due(5.0, "all_reduce", 400) == pytest.approx(5.66)
    assert ring.due(5.0, "all_gather", 400) == pytest.approx(5.99)  # posted at once: after the first


def test_an_emulated_replica_group_completes_no_sooner_than_its_ring(monkeypatch):
    import torch.distributed as dist

    from petra_core.engine.distributed.replica_group import DistributedReplicaGroup

    class Done:
        def wait(self):
            pass

    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: Done())
    group = DistributedReplicaGroup(None, 2, lambda what, fn: fn(), link=Link(latency=0.05, bandwidth=1e9))
    t = torch.full((4,), 2.0)
    start = time.monotonic()
    group.all_reduce_mean([t])()
    assert time.monotonic() - start >= 0.1  # 2 hops of 50 ms latency
    assert torch.equal(t, torch.ones(4))  # the mean of what the (stand-in) all-reduce summed


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: Link(-1.0, 1e9), "latency=-1.0"),
        (lambda: Link(0.0, 0), "bandwidth=0"),
        (lambda: check_phase_seconds({"fwd": [0.1]}, 1), "phase 'fwd' is not allowed; allowed: forward"),
        (lambda: check_phase_seconds({"forward": [0.1]}, 2), "one time per stage (2)"),
        (lambda: check_phase_seconds({"step": [-0.1]}, 1), "seconds >= 0"),
        (lambda: EmulatedPoint(method="sgd", stages=2), "method='sgd' is not allowed"),
        (lambda: EmulatedPoint(method="backprop", stages=1), "stages=1 is not allowed"),
        (lambda: EmulatedPoint(method="petra", stages=2), "stages=2 is not allowed for petra"),
        (lambda: EmulatedPoint(method="local", stages=3), "no auxiliary heads"),
        (lambda: EmulatedPoint(method="petra", stages=4, minibatches=9), "minibatches=9 leaves no steady window"),
    ],
)
def test_bad_emulation_input_is_one_line(make, needle):
    with pytest.raises(ValueError) as err:
        make()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_phase_is_padded_to_its_target_and_an_overrun_is_counted():
    padding = PhasePadding({"forward": [0.03, 0.0]}, 2)
    worker = SimpleNamespace(replica=0, index=0)
    start = time.perf_counter()
    padding.before("forward", worker, 0)
    padding.after("forward", worker, 0)
    assert time.perf_counter() - start >= 0.03
    short = PhasePadding({"forward": [1e-6, 0.0]}, 2)
    short.before("forward", worker, 0)
    time.sleep(0.002)
    short.after("forward", worker, 0)
    assert short.overran == 1 and padding.overran == 0
    assert padding.measured()["forward"][0] == pytest.approx(0.03, abs=0.02)


def test_padding_changes_no_bit():
    batches = make_batches(6)
    runs = []
    for observers in ((), (PhasePadding({"forward": [0.001] * 10, "backward": [0.001] * 10}, 10),)):
        model = make_model()
        pipe = Simulator(model, "petra", num_batches=6, get_batch=batches.__getitem__, batch_size=6)
        pipe.observers.extend(observers)
        pipe.run()
        runs.append(([r.loss for r in pipe.head_log], [p.clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_the_chain_has_one_stage_per_rank_and_the_window_leaves_out_the_fill():
    point = EmulatedPoint(method="petra", stages=4, minibatches=20)
    assert len(chain_model(4)) == 4 and chain_model(4).kinds == "S R R H"
    assert steady_margin(point) == 4
    assert steady_margin(EmulatedPoint(method="gpipe", stages=3, k=2, minibatches=20)) == 4  # whole groups of 2


def test_message_delays_time_the_live_link_on_the_critical_path():
    """Replica 0's clocks only; the latency over the messages the main thread waited for (asked
    before arrival), send to held; delivery over every message."""
    fwd, bwd = (0, 0, 1), (1, 1, 0)  # (direction, src, dst)
    clock = [
        ["sent", *fwd, 0, 1.000], ["arrived", *fwd, 0, 1.004], ["asked", *fwd, 0, 1.001], ["taken", *fwd, 0, 1.005],
        ["sent", *bwd, 0, 2.000], ["arrived", *bwd, 0, 2.002], ["asked", *bwd, 0, 2.010], ["taken", *bwd, 0, 2.010],
    ]  # fmt: skip
    other = [["sent", *fwd, 0, 0.0], ["arrived", *fwd, 0, 9.0]]  # replica 1's, the same keys: left out
    ranks = [{"replica": 0, "clock": clock}, {"replica": 1, "clock": other}]
    delays = message_delays(ranks)
    assert delays["messages"] == 2 and delays["waited"] == 1
    assert delays["delivery_s"] == pytest.approx(0.003)  # the median of 4 and 2 ms
    assert delays["latency_s"] == pytest.approx(0.005) and delays["handoff_s"] == pytest.approx(0.001)


@pytest.mark.slow
@pytest.mark.alone  # its pace is wall-clock: another worker's load moves it
def test_an_emulated_pipeline_runs_at_its_slowest_stage_and_a_slow_link_sets_the_pace():
    """Three ranks, PETRA: 40 ms of compute per stage and minibatch; then a link that needs 120 ms
    per message. The losses are the same bits with and without emulation."""
    phases = {"forward": [0.01] * 3, "rebuild": [0.0] * 3, "backward": [0.03] * 3, "step": [0.0] * 3}
    plain = measure_point(EmulatedPoint(method="petra", stages=3, minibatches=14), timeout=300)
    padded = measure_point(EmulatedPoint(method="petra", stages=3, minibatches=14, phase_seconds=phases), timeout=300)
    size = plain["message_bytes"]["backward"][-1]  # the head sends back a gradient and its rebuilt input: the largest
    slow = EmulatedPoint(method="petra", stages=3, minibatches=14, phase_seconds=phases, link=(0.0, size / 0.12))
    linked = measure_point(slow, timeout=300)
    assert plain["losses"] == padded["losses"] == linked["losses"] and len(plain["losses"]) == 14
    # a phase's real compute (well under its 10 or 30 ms) overruns its target only when the machine is
    # busy enough to hold a rank off its core: a few of the 3 x 14 x 2 phases at most
    assert padded["padded_over"] <= 3
    assert padded["phase_seconds"]["backward"][1] == pytest.approx(0.03, rel=0.3)
    assert padded["seconds_per_minibatch"] == pytest.approx(0.04, rel=0.35)
    assert linked["seconds_per_minibatch"] == pytest.approx(0.12, rel=0.35)
    # the engine's own time per tick, outside the padded phases and the waits: far below a phase
    assert all(0 <= h < 0.01 for h in padded["host_seconds"]) and padded["message_delays"]["messages"] == 4 * 14
    # a waited-for message paid the emulated link's hold (up to 120 ms; the forward messages are smaller)
    assert linked["message_delays"]["latency_s"] > 10 * padded["message_delays"]["latency_s"]
