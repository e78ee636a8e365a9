"""The mesh on torch.distributed: replicas × pipeline positions (engine/worlds/, engine/distributed/).

* the ``Mesh`` arithmetic (row-major, as ``init_device_mesh`` with dims ("replica", "pipeline"));
* dp on R = 2 × P = 1 and R = 2 × P = 2 gloo ranks ends with the simulator's replica 0 bit for bit
  (every tensor of the state_dict, buffers included), under backprop and PETRA;
* one rank of a 2 × 2 mesh SIGKILLed mid-run: every rank exits within 60 s and each survivor
  names the killed rank by its mesh coordinate;
* two torchrun agents (``--nnodes 2``, a c10d rendezvous on 127.0.0.1) run a 2 × 2 mesh across
  them: the same bits as one node, and RANK (mesh coordinate, data), LOCAL_RANK (device) never
  confused.

Processes are plain subprocesses on 127.0.0.1 with one torch thread each.
"""

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import SMALL, free_port, rank_argv
from harness.compare import assert_bit_for_bit, check_outcome, simulator_state
from harness.ranks import RANKS

from petra_core.engine.launch import launch_local
from petra_core.engine.worlds import Mesh

COMMON = rank_argv(8, *SMALL, "--replicas", "2")


def test_mesh_coordinates_are_row_major():
    mesh = Mesh(replicas=2, positions=3)
    assert mesh.size == 6 and str(mesh) == "2x3"
    assert [mesh.coordinate(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(mesh.rank(*mesh.coordinate(r)) == r for r in range(6))


@pytest.mark.slow
@pytest.mark.parametrize("positions", [1, 2])
def test_dp_on_the_mesh_matches_the_simulator(tmp_path, positions):
    argv = [
        *COMMON,
        "--method",
        "backprop,petra",
        "--save",
        str(tmp_path / "{method}.pt"),
        "--where",
        str(tmp_path / "where"),
    ]
    procs = launch_local(argv, 2 * positions, timeout=200, capture=True, script=RANKS)
    check_outcome(procs)
    where = [json.loads((tmp_path / f"where.{r}.json").read_text()) for r in range(2 * positions)]
    assert [(w["replica"], w["position"]) for w in where] == [divmod(r, positions) for r in range(2 * positions)]
    for w in where:  # the replicas' disjoint shards of the stream, read where stage 0 lives
        assert w["fetched"] == ([t * 2 + w["replica"] for t in range(8)] if w["position"] == 0 else []), w
    for method in ("backprop", "petra"):
        assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv, method), method)


@pytest.mark.slow
def test_a_killed_rank_of_a_2x2_mesh_is_named_by_its_coordinate():
    """Rank 3 (replica 1, stages 5-9) SIGKILLs itself at tick 8: its pipeline neighbour (rank 2),
    its replica peer (rank 1) and rank 0 exit non-zero within 60 s, each naming it."""
    argv = [*COMMON, "--method", "petra", "--steps", "40", "--timeout", "30", "--fault", "3:8:kill"]
    procs = launch_local(argv, 4, timeout=150, capture=True, script=RANKS)
    killed = procs[3]
    assert killed.returncode == -9, killed.err
    for r in (0, 1, 2):
        p = procs[r]
        assert p.returncode not in (0, None), f"rank {r}: {p.returncode}"
        assert p.ended - killed.ended < 60, f"rank {r} took {p.ended - killed.ended:.1f} s to stop"
        first = p.err.strip().splitlines()[0]
        assert re.search(r"of replica 1 \(rank 3\)|rank 3 \(replica 1, stages 5-9\)", first), (r, p.err)


@pytest.mark.slow
def test_two_torchrun_nodes_equal_one_node(tmp_path):
    argv = [*COMMON, "--method", "petra", "--placement", "0-4,5-9"]

    def torchrun(nnodes, node_rank, port, out):
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nnodes}",
                f"--node-rank={node_rank}",
                f"--nproc-per-node={4 // nnodes}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=petra-test",
                RANKS,
                *argv,
                "--save",
                str(out / "{method}.pt"),
                "--where",
                str(out / "where"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    port = free_port()
    nodes = [torchrun(2, 0, port, two), torchrun(2, 1, port, two)]
    results = [p.communicate(timeout=240) for p in nodes]
    for p, (_, err) in zip(nodes, results):
        assert p.returncode == 0, err[-3000:]
    single = torchrun(1, 0, free_port(), one)
    _, err = single.communicate(timeout=240)
    assert single.returncode == 0, err[-3000:]
    assert_bit_for_bit(torch.load(two / "petra.pt"), torch.load(one / "petra.pt"), "two nodes vs one")
    assert_bit_for_bit(torch.load(two / "petra.pt"), simulator_state(argv, "petra"), "two nodes vs the simulator")
    where = [json.loads((two / f"where.{r}.json").read_text()) for r in range(4)]
    for r, w in enumerate(where):
        assert (w["replica"], w["position"]) == divmod(r, 2), w  # the mesh follows RANK ...
        assert w["local_rank"] == r - 2 * w["group_rank"], w  # ... and LOCAL_RANK only counts within a node
        assert w["fetched"] == ([t * 2 + w["replica"] for t in range(8)] if w["position"] == 0 else []), w
    assert sorted(w["group_rank"] for w in where) == [0, 0, 1, 1]
