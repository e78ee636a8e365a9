"""The ranks part of a world: the clock, the run's collectives and failure reports
(petra_core/engine/worlds/ranks.py in one process; petra_core/engine/distributed/ranks.py on a
process group, here one of a single rank in this process)."""

import pytest
import torch
import torch.distributed as dist

from petra_core.engine.distributed.placement import RankPlacement
from petra_core.engine.distributed.ranks import DistributedRanks
from petra_core.engine.worlds import LocalRanks, Mesh


def test_in_one_process_every_collective_is_of_one():
    ranks = LocalRanks()
    ranks.begin_tick(3)
    assert ranks.gather_object("a") == ["a"] and ranks.all_objects(1) == [1] and ranks.share({"x": 1}) == {"x": 1}
    assert ranks.together(lambda: 5) == 5 and ranks.on_main(lambda: 6) == 6 and ranks.all_true(False) is False
    assert ranks.agree("SIGTERM", None, 3) == ("SIGTERM", None) and ranks.report("gone") == "gone"
    ranks.end_tick(3)


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_process_group_of_one_rank(one_rank_group):
    placement = RankPlacement(Mesh(1, 1), 0, torch.device("cpu"))
    placement.connect([range(0, 4)])
    ranks = DistributedRanks(placement, timeout=10)
    try:
        ranks.begin_tick(2)
        assert ranks.gather_object("a") == ["a"] and ranks.all_objects(1) == [1] and ranks.share(7) == 7
        assert ranks.all_true(True) and not ranks.all_true(False)
        assert ranks.agree(None, None, 2) == (None, None)
        assert ranks.agree("SIGTERM", "loss nan", 2) == ("SIGTERM (rank 0)", "loss nan")
        with pytest.raises(ValueError, match="bad value"):  # an allowed error keeps its type on every rank
            ranks.together(lambda: (_ for _ in ()).throw(ValueError("bad value")))
        ranks.end_tick(2)
        assert ranks.tick == 3  # between ticks a rank is at the next one
    finally:
        ranks.close()
