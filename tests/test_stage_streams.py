"""A CUDA stream per stage in one process (petra_core/engine/stage_streams.py): where it runs, the
order of its waits within a tick (traced without a GPU), and on a GPU the bits of the default stream.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from conftest import make_batches, make_model, resumed

from petra_core import Pipeline, Recipe
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.stage_streams import StageStreams, check_stage_streams
from petra_core.run.config import ConfigError, RunConfig
from petra_core.run.trainer import session_plan

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _spec(model, batches, *, device="cpu", replicas=1, stage_streams=False, phases="eager", method="petra"):
    return PipelineSpec(
        model=model,
        method=method,
        world=LocalWorld(devices=[torch.device(device)], replicas=replicas),
        num_batches=len(batches),
        get_batch=batches.__getitem__,
        batch_size=len(batches[0][1]),
        batches_per_epoch=4,
        recipe=LR,
        phases=phases,
        stage_streams=stage_streams,
    )


@pytest.mark.parametrize(
    "value,kw,needle",
    [
        ("yes", {}, "stage_streams='yes' is not allowed; allowed: true, false"),
        (True, {"replicas": 2}, "one replica per process, not 2"),
        (True, {"one_process": False}, "in one process (the simulator), not on ranks"),
        (True, {"devices": ["cpu", "cuda:0"]}, "stages are on cpu: use false"),
    ],
)
def test_stage_streams_are_refused_in_one_line_where_they_cannot_run(value, kw, needle):
    with pytest.raises(ValueError, match=re.escape(needle)) as err:
        check_stage_streams(value, **kw)
    assert "\n" not in str(err.value)
    assert check_stage_streams(False, devices=["cpu"], replicas=3, one_process=False) is False


def test_a_pipeline_on_cpu_refuses_stage_streams_and_a_run_config_says_so_in_one_line():
    with pytest.raises(ValueError, match="stages are on cpu"):
        Pipeline.build(_spec(make_model(), make_batches(2), stage_streams=True))
    with pytest.raises(ValueError, match="one replica per process, not 2"):
        _spec(make_model(), make_batches(2), replicas=2, stage_streams=True)
    cfg = RunConfig.from_dict({"dataset": "synthetic", "arch": "revnet18", "width": 4, "stage_streams": True})
    with pytest.raises(ConfigError, match="stage_streams=true gives CUDA stages streams; stages are on cpu"):
        session_plan(cfg)


class Trace:
    """torch.cuda's streams as far as stage_streams.py uses them, logging each wait and entry."""

    def __init__(self):
        self.log, self.entered = [], []

    def Stream(self, device):  # noqa: N802 (torch's name)
        trace = self

        class S:
            def __init__(self):
                self.device, self.label = device, f"stage{len(trace.entered)}"
                trace.entered.append(self)

            def wait_stream(self, other):
                trace.log.append(("wait", self.label, other.label))

        return S()

    def current_stream(self, device):
        trace = self

        class Current:
            label = f"current:{device}"

            def wait_stream(self, other):
                trace.log.append(("wait", self.label, other.label))

        return Current()

    def stream(self, s):
        self.log.append(("enter", s.label))
        return contextlib.nullcontext()


class Worker:
    def __init__(self, device):
        self.device = torch.device(device)


def test_a_stage_waits_for_the_runners_stream_before_it_acts_and_the_runner_joins_every_stage_at_tick_end(
    monkeypatch,
):
    """Within a tick the stages never wait for each other (their messages come from earlier ticks):
    each waits for the runner's stream when it starts, and the runner waits for all at the end."""
    trace = Trace()
    for name in ("Stream", "current_stream", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(trace, name))
    workers = [Worker("cuda:0"), Worker("cuda:0"), Worker("cuda:1")]
    streams = StageStreams(workers)
    for w in workers:
        with streams.acting(w):
            pass
    streams.join()
    assert trace.log == [
        ("wait", "stage0", "current:cuda:0"),  # after what the runner queued (steps, a loaded checkpoint)
        ("enter", "stage0"),
        ("wait", "stage1", "current:cuda:0"),
        ("enter", "stage1"),
        ("wait", "stage2", "current:cuda:1"),
        ("enter", "stage2"),
        ("wait", "current:cuda:0", "stage0"),  # the tick's end: steps, logs and checkpoints see it all
        ("wait", "current:cuda:0", "stage1"),
        ("wait", "current:cuda:1", "stage2"),
    ]


class Recorder:
    """A pipeline's ``streams`` that records what the runner asks of it."""

    def __init__(self):
        self.log = []

    def acting(self, worker):
        self.log.append(("act", worker.index))
        return contextlib.nullcontext()

    def join(self):
        self.log.append(("join",))


def test_the_runner_enters_each_stage_for_its_action_and_joins_once_per_tick_with_unchanged_bits():
    batches = make_batches(5)
    reference = make_model()
    Pipeline.build(_spec(reference, batches)).run()
    model = make_model()
    pipe = Pipeline.build(_spec(model, batches))
    pipe.streams = recorder = Recorder()
    pipe.run(3)
    J = len(model)
    busy = [[j for j in pipe.schedule.busy(t)] for t in range(3)]
    expected = [e for t in range(3) for e in [*(("act", j) for j in busy[t]), ("join",)]]
    assert recorder.log == expected and len(busy[2]) == min(3, J)
    pipe.run()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


# ---- on a GPU: the bits of the default stream -----------------------------------------------------
def _train_on_gpu(stage_streams, phases="eager", interrupt_at=None, n=12):
    model, batches = make_model().to("cuda"), [(x.cuda(), y) for x, y in make_batches(n)]

    def pipeline(model):
        return Pipeline.build(_spec(model, batches, device="cuda", stage_streams=stage_streams, phases=phases))

    pipe = pipeline(model)
    if interrupt_at is not None:
        model, pipe = resumed(pipe, model, interrupt_at, lambda: make_model(seed=1).to("cuda"), pipeline)
    pipe.run()
    return {k: v.cpu() for k, v in model.state_dict().items()}, [r.loss for r in pipe.head_log]


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("phases", ["eager", "static", "graphs"])
def test_stage_streams_give_the_bits_of_the_default_stream_on_a_gpu(phases, deterministic_gpu):
    plain, streamed = _train_on_gpu(False, phases), _train_on_gpu(True, phases)
    assert plain[1] == streamed[1]
    assert [k for k in plain[0] if not torch.equal(plain[0][k], streamed[0][k])] == []


@cuda
@pytest.mark.gpu
def test_a_run_with_stage_streams_resumes_with_the_bits_of_an_uninterrupted_one_on_a_gpu(deterministic_gpu):
    whole, resumed_run = _train_on_gpu(True), _train_on_gpu(True, interrupt_at=9)
    assert whole[1] == resumed_run[1]
    assert all(torch.equal(whole[0][k], resumed_run[0][k]) for k in whole[0])
