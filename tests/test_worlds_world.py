"""A world as a composition of parts (petra_core/engine/worlds/world.py; the distributed one,
petra_core/engine/distributed/world.py): a part can be replaced without touching the others, and
the distributed world, composed of its own parts, trains to the simulator's bits."""

import torch
import torch.distributed as dist
from conftest import make_batches, make_model

from petra_core import Pipeline, Recipe, Simulator
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.distributed import DistributedWorld
from petra_core.engine.worlds import LocalTransport

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)


class RecordingTransport:
    """A transport that hands every message to a local one and notes (direction, replica, stage)."""

    def __init__(self, inner: LocalTransport):
        self.inner, self.log = inner, []

    def send_forward(self, replica, src, msg):
        self.log.append(("forward", replica, src, msg.mb))
        self.inner.send_forward(replica, src, msg)

    def send_backward(self, replica, src, msg):
        self.log.append(("backward", replica, src, msg.mb))
        self.inner.send_backward(replica, src, msg)

    def __getattr__(self, name):  # receiving, ticks, state: the inner transport's
        return getattr(self.inner, name)


def train(world, method="petra", n=4, **kwargs):
    batches = make_batches(n * world.placement.mesh.replicas)  # each replica its own minibatches
    model = make_model()
    spec = PipelineSpec(
        model=model,
        method=method,
        world=world,
        num_batches=n,
        get_batch=batches.__getitem__,
        batch_size=6,
        recipe=LR,
        **kwargs,
    )
    pipe = Pipeline.build(spec)
    return pipe.run()


def test_a_world_composed_with_another_transport_runs_the_same_bits():
    plain = train(LocalWorld(replicas=2))
    world = LocalWorld(replicas=2)
    world.transport = recording = RecordingTransport(world.transport)
    composed = train(world)
    for a, b in zip(plain.replicas, composed.replicas):
        assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    J = len(composed.model)
    # every replica's minibatch crosses every boundary forward (stage j -> j+1) and back (j+1 -> j)
    assert sorted(recording.log) == sorted(
        [("forward", r, j, mb) for r in (0, 1) for j in range(J - 1) for mb in range(4)]
        + [("backward", r, j, mb) for r in (0, 1) for j in range(1, J) for mb in range(4)]
    )


def test_the_distributed_world_on_one_rank_is_its_own_composition_and_matches_the_simulator():
    batches = make_batches(4)
    reference = make_model()
    Simulator(reference, "petra", num_batches=4, get_batch=batches.__getitem__, batch_size=6, recipe=LR).run()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        world = DistributedWorld("cpu", timeout=10)
        assert not isinstance(world, LocalWorld)
        model = make_model()
        spec = PipelineSpec(
            model=model,
            method="petra",
            world=world,
            num_batches=4,
            get_batch=batches.__getitem__,
            batch_size=6,
            recipe=LR,
        )
        pipe = Pipeline.build(spec)
        # one issue lock per world: the transport's threads and the replica axis post under it
        assert world.transport.issue is world.issue is world.groups.replica_group(0).issue
        pipe.run(3)
        in_flight = pipe.state_dict()["world"]  # the checkpoint layout resume reads
        assert set(in_flight) == {"local", "ready"} and in_flight["ready"] == {} and in_flight["local"]
        pipe.run()
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
        world.leave()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
