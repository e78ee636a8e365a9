"""The replica-groups part of a world (petra_core/engine/worlds/replica_groups.py): every stage of
a process meets its copies in one group; in one process it averages them at once."""

import torch

from petra_core.engine.worlds import LocalReplicaGroup, LocalWorld, OneGroup


def test_every_stage_meets_its_copies_in_the_one_group():
    group = LocalReplicaGroup(3)
    groups = OneGroup(group)
    assert all(groups.replica_group(j) is group for j in range(5))
    world = LocalWorld(replicas=2)
    assert world.groups.replica_group(0) is world.groups.replica_group(4) and world.groups.replica_group(0).size == 2


def test_the_local_group_averages_in_replica_order_and_counts_what_one_replica_sends():
    group = LocalReplicaGroup(3)
    tensors = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([0.5, 0.0])]
    expected = ((tensors[0] + tensors[1]) + tensors[2]) / 3
    group.all_reduce_mean(tensors)()
    assert all(torch.equal(t, expected) for t in tensors) and group.floats_sent == 2


class _HeldLock:
    """A lock that records whether it was held when an NCCL operation was posted."""

    def __init__(self):
        self.held = False

    def __enter__(self):
        self.held = True

    def __exit__(self, *exc):
        self.held = False


def test_the_distributed_group_posts_every_collective_under_the_worlds_issue_lock(monkeypatch):
    """NCCL forbids two threads issuing at once: the replica axis' collectives share the lock the
    transport's receiver threads post under (DistributedWorld.issue), and leave it before waiting."""
    import torch.distributed as dist

    from petra_core.engine.distributed.replica_group import DistributedReplicaGroup

    lock, posted = _HeldLock(), []

    class Work:
        def wait(self):
            posted.append(("wait", lock.held))

    def op(name):
        def post(*args, **kwargs):
            posted.append((name, lock.held))
            return Work()

        return post

    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather"):
        monkeypatch.setattr(dist, name, op(name))
    group = DistributedReplicaGroup(None, 2, lambda what, fn: fn(), issue=lock)
    group.all_reduce_mean([torch.ones(4)])()
    group.reduce_scatter_mean([torch.ones(4)])()
    group.all_gather([torch.ones(4)])()
    assert posted == [
        ("all_reduce", True),
        ("wait", False),
        ("reduce_scatter_tensor", True),
        ("wait", False),
        ("all_gather", True),
        ("wait", False),
    ]
