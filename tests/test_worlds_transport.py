"""The transport part of a world (petra_core/engine/worlds/transport.py): in-process FIFOs, one per
(replica, direction, receiving stage), whose in-flight messages survive a tick boundary's
state_dict and go to the receiving stage's device."""

import pytest
import torch

from petra_core.engine.messages import BackwardMsg, ForwardMsg
from petra_core.engine.worlds import LocalPlacement, LocalTransport


def connected(devices=None, replicas=2, stages=4):
    placement = LocalPlacement(devices, replicas=replicas)
    placement.connect([range(stages)])
    return LocalTransport(placement)


def test_fifos_round_trip_through_state_dict_at_a_tick_boundary():
    sender = connected()
    g = torch.Generator().manual_seed(0)
    sent = {}
    for mb in range(3):  # three ticks' messages in flight, in two replicas and both directions
        for r in (0, 1):
            fwd = ForwardMsg(mb, torch.randn(2, 3, generator=g), torch.tensor([mb, r]))
            bwd = BackwardMsg(mb, torch.randn(2, 3, generator=g))
            sender.send_forward(r, 1, fwd)
            sender.send_backward(r, 3, bwd)
            sent[r, mb] = (fwd, bwd)
    state = sender.state_dict()
    assert set(state) == {(r, d, 2) for r in (0, 1) for d in ("forward", "backward")}

    receiver = connected()
    receiver.load_state_dict(state)
    for mb in range(3):  # first in, first out, each replica on its own
        for r in (1, 0):
            fwd, bwd = receiver.recv_forward(r, 2), receiver.recv_backward(r, 2)
            assert fwd.mb == bwd.mb == mb
            assert torch.equal(fwd.activation, sent[r, mb][0].activation)
            assert torch.equal(fwd.labels, sent[r, mb][0].labels)
            assert torch.equal(bwd.grad, sent[r, mb][1].grad)
    assert receiver.state_dict() == {}


def test_a_restored_message_goes_to_the_receiving_stages_device():
    sender = connected(replicas=1)
    sender.send_forward(0, 0, ForwardMsg(5, torch.ones(2), torch.tensor([1, 2])))
    receiver = connected([torch.device("meta")], replicas=1)
    receiver.load_state_dict(sender.state_dict())
    msg = receiver.recv_forward(0, 1)
    assert msg.mb == 5 and msg.activation.device.type == "meta" and msg.labels.device.type == "meta"


def test_receiving_what_nobody_sent_is_an_error():
    with pytest.raises(IndexError):
        connected().recv_forward(0, 1)
