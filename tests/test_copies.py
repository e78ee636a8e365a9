"""Messages between devices of one process (petra_core/engine/copies.py), traced without a GPU:
GPU-to-GPU copies run on copy streams of both devices, ordered by events, with record_stream;
labels stay on the host until the head takes them."""

from unittest import mock

import pytest
import torch
from conftest import make_model
from torch import Tensor

from petra_core import Pipeline, Recipe
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.copies import DeviceCopies
from petra_core.engine.messages import BackwardMsg, ForwardMsg
from petra_core.engine.observers import Observer

GPU0, GPU1 = torch.device("cuda:0"), torch.device("cuda:1")


class FakeCuda:
    """torch.cuda's streams and events as far as copies.py uses them, logging every call in order."""

    def __init__(self):
        self.trace = []
        self.current = {}  # device -> the stream code enqueued there runs on

    def stream_of(self, device):
        return self.current.setdefault(device, f"compute:{device}")

    def Stream(self, device):  # noqa: N802 (torch's name)
        s = mock.Mock(name=f"copy:{device}")
        s.label, s.device = f"copy:{device}", device
        s.wait_stream.side_effect = lambda other: self.trace.append(("wait_stream", s.label, label(other)))
        self.trace.append(("new_stream", s.label))
        return s

    def current_stream(self, device):
        s = mock.Mock(name=self.stream_of(device))
        s.label = self.stream_of(device)
        s.wait_event.side_effect = lambda e: self.trace.append(("wait_event", s.label, e.label))
        return s

    def stream(self, s):
        fake = self

        class Scope:
            def __enter__(self):
                self.previous = fake.stream_of(s.device)
                fake.current[s.device] = s.label

            def __exit__(self, *exc):
                fake.current[s.device] = self.previous

        return Scope()

    def Event(self):  # noqa: N802
        e = mock.Mock()
        e.label = "event"
        e.record.side_effect = lambda s: self.trace.append(("record_event", label(s)))
        return e

    def tensor(self, device, name):
        t = mock.MagicMock(spec=Tensor)
        t.device, t.label = device, name

        def to(dst, non_blocking=False):
            self.trace.append(("copy", name, str(dst), non_blocking, self.stream_of(device), self.stream_of(dst)))
            return self.tensor(dst, f"{name}@{dst}")

        t.to.side_effect = to
        t.record_stream.side_effect = lambda s: self.trace.append(("record_stream", name, label(s)))
        return t


def label(s):
    return s if isinstance(s, str) else s.label


@pytest.fixture
def cuda():
    fake = FakeCuda()
    with mock.patch.multiple(
        torch.cuda, Stream=fake.Stream, current_stream=fake.current_stream, stream=fake.stream, Event=fake.Event
    ):
        yield fake


def test_a_gpu_to_gpu_message_is_copied_on_copy_streams_and_handed_over_by_an_event(cuda):
    copies = DeviceCopies()
    labels = torch.arange(4)  # on the host: not copied at all
    msg = ForwardMsg(3, cuda.tensor(GPU0, "y"), labels)
    sent, event = copies.sent(msg, GPU1)
    assert sent.labels is labels and sent.activation.device == GPU1
    assert cuda.trace == [
        ("new_stream", "copy:cuda:0"),
        ("new_stream", "copy:cuda:1"),
        ("wait_stream", "copy:cuda:0", "compute:cuda:0"),  # after the producer's kernels, nothing else
        # both devices' current streams are copy streams: the copy never waits for GPU 1's compute
        ("copy", "y", "cuda:1", True, "copy:cuda:0", "copy:cuda:1"),
        ("record_stream", "y", "copy:cuda:0"),  # the source is not freed while the copy reads it
        ("record_event", "copy:cuda:1"),
    ]
    cuda.trace.clear()
    assert DeviceCopies.taken(sent, event, GPU1) is sent
    assert cuda.trace == [
        ("wait_event", "compute:cuda:1", "event"),  # the consumer waits when it takes it
        ("record_stream", "y@cuda:1", "compute:cuda:1"),
    ]


def test_a_revnet_pair_of_streams_goes_through_the_copy_streams_tensor_by_tensor(cuda):
    """A pair (x, x~) is copied as two tensors on the copy streams, with one event for the message
    (not left for the stage's own ``.to``, which would chain the GPUs on their compute streams)."""
    copies = DeviceCopies()
    msg = BackwardMsg(2, (cuda.tensor(GPU1, "g1"), cuda.tensor(GPU1, "g2")), None)
    sent, event = copies.sent(msg, GPU0)
    assert [t.device for t in sent.grad] == [GPU0, GPU0] and event is not None
    copied = [step for step in cuda.trace if step[0] == "copy"]
    assert copied == [
        ("copy", "g1", "cuda:0", True, "copy:cuda:1", "copy:cuda:0"),
        ("copy", "g2", "cuda:0", True, "copy:cuda:1", "copy:cuda:0"),
    ]
    assert [step for step in cuda.trace if step[0] == "record_event"] == [("record_event", "copy:cuda:0")]
    cuda.trace.clear()
    DeviceCopies.taken(sent, event, GPU0)
    assert cuda.trace == [
        ("wait_event", "compute:cuda:0", "event"),
        ("record_stream", "g1@cuda:0", "compute:cuda:0"),
        ("record_stream", "g2@cuda:0", "compute:cuda:0"),
    ]


def test_a_taker_on_its_own_stream_marks_every_tensor_it_takes(cuda):
    """Stage streams: on one GPU nothing is copied, but the taker's stream is not the maker's, so
    each tensor is marked as used by the taker (the allocator keeps it for both streams)."""
    msg = ForwardMsg(1, (cuda.tensor(GPU0, "x1"), cuda.tensor(GPU0, "x2")), torch.arange(2))
    sent, event = DeviceCopies().sent(msg, GPU0)
    assert sent is msg and event is None
    DeviceCopies.taken(sent, event, GPU0, record=True)
    assert cuda.trace == [("record_stream", "x1", "compute:cuda:0"), ("record_stream", "x2", "compute:cuda:0")]


def test_nothing_is_copied_or_waited_for_on_one_device(cuda):
    copies = DeviceCopies()
    msg = BackwardMsg(1, cuda.tensor(GPU1, "g"), None)
    sent, event = copies.sent(msg, GPU1)
    assert sent is msg and event is None and DeviceCopies.taken(sent, event, GPU1) is msg
    assert copies.sent(msg, None) == (msg, None)
    assert cuda.trace == []


class SeenLabels(Observer):
    def __init__(self):
        self.fetched_devices, self.sent_devices = set(), set()

    def fetched(self, replica, mb, batch):
        self.fetched_devices.add(batch[1].device.type)

    def sent(self, worker, direction, msg):
        if direction == "forward":
            self.sent_devices.add(msg.labels.device.type)


def test_labels_stay_on_the_host_until_the_head_takes_them():
    """Stages on a device (meta here, a GPU in use): images go to stage 0's device, labels travel
    from the host to the head's device directly, never through stage 0's device."""
    model = make_model()
    x, y = torch.randn(2, 3, 16, 16), torch.randint(0, 5, (2,))
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method="petra",
            world=LocalWorld(devices=[torch.device("meta")]),
            num_batches=4,
            get_batch=lambda mb: (x, y),
            batch_size=2,
            recipe=Recipe(scale_lr=False),
        )
    )
    seen = SeenLabels()
    pipe.observers.append(seen)
    pipe.run()
    assert seen.fetched_devices == {"cpu"} and seen.sent_devices == {"cpu"}
    assert pipe.done and next(pipe.model[-1].parameters()).device.type == "meta"
