"""The placement part of a world: where this process sits in the mesh and where its stages run
(petra_core/engine/worlds/placement.py; a rank's, petra_core/engine/distributed/placement.py)."""

import pytest
import torch

from petra_core.engine.distributed.placement import RankPlacement
from petra_core.engine.worlds import LocalPlacement, Mesh


def test_one_process_holds_every_cell_and_spreads_stages_over_its_devices_in_blocks():
    p = LocalPlacement([torch.device("meta"), torch.device("cpu")], replicas=3)
    p.connect([range(0, 4)])
    assert (p.rank, p.world_size, p.is_main, p.position, p.mesh) == (0, 1, True, 0, Mesh(3, 1))
    assert p.replicas == range(3) and p.stages == range(0, 4)
    assert [p.device_for(j).type for j in p.stages] == ["meta", "meta", "cpu", "cpu"]
    assert LocalPlacement().device_for(0) is None  # no devices: stages stay where they are


@pytest.mark.parametrize("replicas", [0, -1, 1.5, True, "2"])
def test_replicas_must_be_a_positive_integer(replicas):
    with pytest.raises(ValueError, match=f"replicas must be an integer >= 1, got {replicas!r}"):
        LocalPlacement(replicas=replicas)


def test_a_rank_is_its_cell_of_the_mesh_and_names_itself_and_its_peers_by_it():
    p = RankPlacement(Mesh(2, 2), 3, torch.device("cpu"))
    assert (p.replica, p.position, p.replicas, p.is_main, p.world_size) == (1, 1, range(1, 2), False, 4)
    assert p.describe() == "rank 3 (replica 1)"  # before connect: no stages yet
    p.connect([range(0, 5), range(5, 10)])
    assert p.stages == range(5, 10) and p.device_for(7) == torch.device("cpu")
    assert p.describe() == "rank 3 (replica 1, stages 5-9)"
    assert p.name_rank(0) == "rank 0 (replica 0, stages 0-4)"
    assert p.name_stage(2, 0) == "stage 2 of replica 1 (rank 2)"
    alone = RankPlacement(Mesh(1, 2), 0, torch.device("cpu"))
    alone.connect([range(0, 5), range(5, 10)])
    assert (
        alone.is_main and alone.name_rank(1) == "rank 1 (stages 5-9)" and alone.name_stage(7, 1) == "stage 7 (rank 1)"
    )
