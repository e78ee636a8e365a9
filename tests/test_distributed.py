"""The distributed runtime (engine/distributed/, petra_core/placement.py, petra_core/launch.py).

* placement: pure functions (even split, exact balanced split checked against brute force, specs);
* wire format: header round trip for every slot layout;
* 2 ranks under torchrun and 3 ranks under the local launcher (gloo, CPU, one thread each): a
  tiny RevNet trained 10 minibatches with PETRA and with delayed gradients (and, on 3 ranks, with
  GPipe and 1F1B) ends with the simulator's weights bit for bit (every tensor of the state_dict,
  buffers included);
* failures: a rank SIGKILLed mid-run, and a rank that hangs — every process exits non-zero
  quickly and the survivors name the failed stage.

Processes are plain subprocesses on 127.0.0.1; each sets torch.set_num_threads(1), and so does
the simulator reference here (the same kernels on the same thread count).
"""

import itertools
import random
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from conftest import free_port, named_failed, rank_argv
from harness.compare import assert_bit_for_bit, check_outcome, simulator_state
from harness.ranks import RANKS

from petra_core.engine.distributed.wire import SLOTS, flatten, from_wire, restore_layout, to_wire, unflatten
from petra_core.engine.launch import launch_local
from petra_core.engine.placement import (
    check_placement,
    even_partition,
    format_placement,
    parse_placement,
    partition_contiguous,
)
from petra_core.models import streams

# ---- placement -------------------------------------------------------------------------------------


def test_even_partition():
    assert even_partition(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert even_partition(10, 1) == [range(0, 10)]
    assert even_partition(4, 4) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ValueError, match="cannot place 3 stages on 4 ranks"):
        even_partition(3, 4)


def brute_force(costs, parts):
    J = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, J), parts - 1):
        bounds = (0, *cuts, J)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_partition_contiguous_is_optimal():
    rng = random.Random(0)
    for _ in range(200):
        J = rng.randint(1, 9)
        parts = rng.randint(1, J)
        costs = [rng.choice([0.0, 0.5, 1.0, 2.0, 3.7, 10.0]) for _ in range(J)]
        ranges = partition_contiguous(costs, parts)
        assert check_placement(ranges, J, parts) == ranges
        assert max(sum(costs[j] for j in r) for r in ranges) == pytest.approx(brute_force(costs, parts))


def test_partition_contiguous_examples():
    # RevNet18-like costs: stem cheap, downsampling blocks dearer, head cheap
    assert partition_contiguous([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert partition_contiguous([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
    assert partition_contiguous([1, 1, 1, 1, 1, 5], 2) == [range(0, 5), range(5, 6)]
    # among equally slow splits, the most even one
    assert partition_contiguous([4, 1, 1, 4], 2) == [range(0, 2), range(2, 4)]
    with pytest.raises(ValueError, match="cannot place 2 stages on 3 ranks"):
        partition_contiguous([1, 1], 3)


def test_parse_placement():
    assert parse_placement("0-3,4-9", 10, 2) == [range(0, 4), range(4, 10)]
    assert parse_placement("0,1-8,9", 10, 3) == [range(0, 1), range(1, 9), range(9, 10)]
    assert parse_placement("even", 10, 3) == even_partition(10, 3)
    assert parse_placement("balanced", 3, 2, costs=[1, 1, 2]) == [range(0, 2), range(2, 3)]
    assert parse_placement([(0, 5), (5, 10)], 10, 2) == [range(0, 5), range(5, 10)]
    assert format_placement(parse_placement("0,1-8,9", 10, 3)) == "0,1-8,9"
    for spec, needle in [
        ("0-3,5-9", "rank 1 should start at stage 4"),
        ("0-3,4-8", "covers stages 0-8"),
        ("0-9", "1 stage ranges for 2 ranks"),
        ("1-4,5-9", "rank 0 should start at stage 0"),
        ("a-b,c", "expected 'even', 'balanced' or ranges"),
        ("balanced", "needs measured"),
    ]:
        with pytest.raises(ValueError, match=needle):
            parse_placement(spec, 10, 2)


# ---- wire format -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(4, 6, 5, 5),
        torch.randn(4, 6, 5, 5).to(memory_format=torch.channels_last),
        torch.randn(5, 4).t(),  # non-contiguous: sent as a contiguous copy
        torch.randint(0, 9, (4,)),
        torch.randn(3, dtype=torch.float64),
        None,
    ],
)
def test_wire_round_trip(t):
    slot, dense = to_wire(t)
    received = from_wire(slot, torch.device("cpu"))
    if t is None:
        assert received is None and dense is None
        return
    buf, layout = received
    buf.copy_(dense)
    out = restore_layout(buf, layout)
    assert out.dtype == t.dtype and out.shape == t.shape and torch.equal(out, t)
    assert out.stride() == t.stride() or not t.is_contiguous(memory_format=torch.channels_last)


def test_a_message_of_pairs_travels_as_its_tensors_and_comes_back_as_pairs():
    """A RevNet message's fields are pairs of streams: the wire flattens them into its slots with
    the fields' kinds in the header, and rebuilds the same structure on arrival."""
    pair = (torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4))
    for fields, kinds in [((pair, pair), [2, 2]), ((pair, None), [2, 0]), ((pair[0], torch.arange(2)), [1, 1])]:
        got_kinds, flat = flatten(fields)
        assert got_kinds == kinds and len(flat) == sum(kinds) <= SLOTS
        back = unflatten(got_kinds, flat)
        for a, b in zip(back, fields):
            assert type(a) is type(b)
            assert all(x is y for x, y in zip(streams.tensors(a), streams.tensors(b)))


# ---- bit-for-bit against the simulator -------------------------------------------------------------

COMMON = rank_argv(10)


@pytest.mark.slow
def test_two_ranks_under_torchrun_match_the_simulator(tmp_path):
    argv = [
        *COMMON,
        "--width",
        "4",
        "--image-size",
        "16",
        "--method",
        "petra,delayed",
        "--placement",
        "0-4,5-9",
        "--save",
        str(tmp_path / "{method}.pt"),
    ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--node-rank=0",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        RANKS,
        *argv,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "placement 0-4,5-9" in out.stdout
    for method in ("petra", "delayed"):
        assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv, method), method)


@pytest.mark.slow
def test_three_ranks_balanced_placement_with_accumulation_match_the_simulator(tmp_path):
    # k = 3 over 10 minibatches: the final partial group is flushed like the simulator's
    argv = [
        *COMMON,
        "--width",
        "2",
        "--image-size",
        "8",
        "--k",
        "3",
        "--method",
        "petra,delayed",
        "--placement",
        "balanced",
        "--save",
        str(tmp_path / "{method}.pt"),
    ]
    procs = launch_local(argv, 3, timeout=110, capture=True, script=RANKS)
    check_outcome(procs)
    assert procs[0].out.count("on 3 ranks") == 2
    for method in ("petra", "delayed"):
        assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv, method), method)


@pytest.mark.slow
def test_synchronous_pipelines_on_three_ranks_match_the_simulator(tmp_path):
    """GPipe and 1F1B with k = 3 microbatches a flush over 10 minibatches (a partial last group); the
    head alone on the last rank, so GPipe's head gradients wait on the wire for stage 8's forwards."""
    argv = [
        *COMMON,
        "--width",
        "2",
        "--image-size",
        "8",
        "--k",
        "3",
        "--method",
        "gpipe,1f1b",
        "--placement",
        "0-3,4-8,9",
        "--save",
        str(tmp_path / "{method}.pt"),
    ]
    procs = launch_local(argv, 3, timeout=110, capture=True, script=RANKS)
    check_outcome(procs)
    for method in ("gpipe", "1f1b"):
        assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv, method), method)


@pytest.mark.slow
def test_local_learning_on_two_ranks_matches_the_simulator(tmp_path):
    """local sends no backward message at all; the forward-gradient methods send true gradients."""
    argv = [
        *COMMON,
        "--width",
        "2",
        "--image-size",
        "8",
        "--aux-head",
        "cnn",
        "--method",
        "local,fg-local-w,fg-local-a",
        "--placement",
        "0-3,4-9",
        "--save",
        str(tmp_path / "{method}.pt"),
    ]
    procs = launch_local(argv, 2, timeout=110, capture=True, script=RANKS)
    check_outcome(procs)
    for method in ("local", "fg-local-w", "fg-local-a"):
        assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv, method), method)


# ---- failures ------------------------------------------------------------------------------------------

FAIL = [
    "--arch",
    "revnet18",
    "--num-classes",
    "5",
    "--width",
    "2",
    "--image-size",
    "8",
    "--batch",
    "4",
    "--threads",
    "1",
    "--method",
    "petra",
]


@pytest.mark.slow
def test_killed_rank_stops_every_rank_and_is_named():
    """Rank 2 (stages 7-9) SIGKILLs itself at tick 8: ranks 1 and 0 exit non-zero within seconds;
    both name stage 7 (rank 2) — rank 0 learns it through the rendezvous store."""
    procs = launch_local(
        [*FAIL, "--steps", "40", "--timeout", "30", "--fault", "2:8:kill"], 3, timeout=100, capture=True, script=RANKS
    )
    killed = procs[2]
    assert killed.returncode == -9, killed.err
    for r in (0, 1):
        p = procs[r]
        assert p.returncode not in (0, None), f"rank {r}: {p.returncode}"
        assert p.ended - killed.ended < 60, f"rank {r} took {p.ended - killed.ended:.1f} s to stop"
        first = p.err.strip().splitlines()[0]
        assert first.startswith("petra: stage 7 (rank 2) "), p.err
        assert named_failed(p.err) == {2}, f"rank {r} names a rank that stopped because of it as failed: {p.err}"
        if "(rank 1) " in p.err.split("\n", 1)[-1]:  # rank 0 lost rank 1 after it stopped
            assert "stage 4 (rank 1) stopped because of it" in p.err, p.err


def test_a_failure_message_names_the_failed_rank_and_lists_the_stopped_ones():
    """A rank silent that said nothing failed (killed, crashed, hung); one that left on its own after
    the failure stopped because of it; with neither, the message says what it saw."""
    from petra_core.engine.distributed.failures import gone

    assert gone(["rank 2 (stages 7-9)"], ["rank 1 (stages 4-6)"], None) == (
        "rank 2 (stages 7-9) failed or was killed",
        "; rank 1 (stages 4-6) stopped because of it",
    )
    assert gone(["rank 2"], [], 30.0) == ("rank 2 failed or was killed", "")
    assert gone([], ["rank 1"], None) == ("rank 1 stopped because of an earlier failure", "")
    assert gone([], [], 4.0) == ("another rank stopped responding: timed out after 4 s", "")
    assert gone([], [], None) == ("another rank failed or was killed", "")


def test_a_rank_says_why_it_left_before_it_goes():
    """Through the rendezvous store: a rank that finishes, or reports a failure (its own or a lost
    peer's), says so before its connections close; a killed rank says nothing. The first reason stays."""
    from petra_core.engine.distributed.failures import AFTER_FAILURE, FINISHED, FailureWatch

    store = dist.HashStore()
    watch = [FailureWatch(r, lambda r=r: f"rank {r}", lambda: 0, store=store) for r in range(4)]
    watch[1].close()
    message = watch[2].report("petra: stage 7 (rank 3) failed")
    watch[2].close()
    assert [watch[0].left(r) for r in range(4)] == [None, FINISHED, AFTER_FAILURE, None]
    assert message == "petra: stage 7 (rank 3) failed"
    assert watch[0].report("petra: stage 4 (rank 2) stopped because of it") == (
        "petra: stage 7 (rank 3) failed [seen by rank 2]\n"
        "  then on rank 0: petra: stage 4 (rank 2) stopped because of it"
    )


@pytest.mark.slow
def test_hung_rank_times_out_and_every_rank_exits():
    """Rank 1 stops making progress at tick 6 (alive, sockets open): its neighbours time out
    (timeout 4 s), report stage 4 (rank 1), and the hung rank's own watchdog ends it too."""
    t0 = time.monotonic()
    procs = launch_local(
        [*FAIL, "--steps", "40", "--timeout", "4", "--fault", "1:6:hang"], 3, timeout=100, capture=True, script=RANKS
    )
    assert all(p.returncode not in (0, None, -9) for p in procs), [(p.returncode, p.err) for p in procs]
    assert max(p.ended for p in procs) - t0 < 60
    for r in (0, 2):
        assert "stopped responding" in procs[r].err and "(rank 1)" in procs[r].err.splitlines()[0], procs[r].err
    assert "stopping at tick 6 because of it" in procs[1].err


def test_a_rank_never_shares_a_gpu_by_wrapping_around():
    from petra_core.engine.launch import local_gpu

    assert local_gpu(1, 2) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=2 but 2 GPU\(s\) are visible on this node: launch at most 2"):
        local_gpu(2, 2)


def test_a_receiver_waits_for_a_header_with_a_deadline_not_forever():
    """On NCCL a received header is read only once its event has completed, polled with the
    transport's timeout, so a peer that never sends ends the receiver thread with a timeout."""
    from petra_core.engine.distributed.failures import is_timeout
    from petra_core.engine.distributed.transport import wait_for

    class Never:
        queries = 0

        def query(self):
            self.queries += 1
            return False

    event = Never()
    with pytest.raises(TimeoutError, match="the header of minibatch 3 from rank 1 did not arrive within 0.05 s") as err:
        wait_for(event, 0.05, "the header of minibatch 3 from rank 1")
    assert event.queries > 1 and is_timeout(err.value)

    class Later(Never):
        def query(self):
            self.queries += 1
            return self.queries >= 3

    wait_for(Later(), 5.0, "anything")  # returns as soon as the event completes


def test_a_receive_that_never_lands_times_out_naming_the_edge_and_peer():
    """The NCCL receiver polls its events with a deadline (never an unbounded tolist() or stream
    wait); the error names the minibatch, the edge and the peer rank (a never-completing stand-in
    for the CUDA event: the wait itself is device-independent)."""
    from petra_core.engine.distributed.transport import _Edge, _Receiver, wait_for
    from petra_core.engine.distributed.wire import FORWARD

    class Never:
        def query(self):
            return False

    rx = _Receiver(_Edge(FORWARD, 4, 5, 1, None), torch.device("cpu"), None, timeout=0.05)
    try:
        with pytest.raises(TimeoutError) as err:
            wait_for(Never(), 0.05, f"the header of minibatch 3 {rx.edge_name}")
    finally:
        rx.stop()
    assert str(err.value) == (
        "the header of minibatch 3 on the forward edge stage 4 -> stage 5 from rank 1 did not arrive within 0.05 s"
    )
