"""Suite-wide settings and the tiny shared setups (test files import them: ``from conftest import ...``).

* one torch thread for every test (tiny tensors on 2 shared cores run far faster so);
* the longest files first (``LONGEST_FIRST``: so that a worker of pytest-xdist does not end on one),
  and the ``alone`` tests skipped on a worker (``.ci/run`` runs them after, with ``-m alone``);
* ``make_batches`` / ``make_model``: seeded random minibatches and a tiny staged model;
* ``resumed``: a pipeline saved at a tick and loaded into a fresh model and pipeline, as a run resumes;
* ``named_failed``: the ranks a distributed failure message names as failed (not as stopped);
* ``tiny_run`` / ``argv``: a tiny ``petra train`` config on the synthetic task, as a dict or as
  ``key=value`` arguments; ``TIMING`` / ``untimed``: a run record without its wall-clock keys.
"""

import io
import os
import re
import socket

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from petra_core import METHODS, build_model
from petra_core.engine.observers import Observer
from petra_core.run.verify import TIMING  # the wall-clock keys of a record (differ run to run)

# ---- the order files run in ---------------------------------------------------------------------------
# The files that take longest (`pytest --durations=40`: each over 2 minutes on one core), first. Under
# pytest-xdist (the README's `-n auto --dist loadfile`: every file on one worker, so a module fixture
# is built once) a worker takes the next file when it is done, so a long file taken last would run
# alone at the end; taken first, the short files fill in around it.
LONGEST_FIRST = ("test_gpu.py", "test_committed_artifacts.py", "test_workflow.py", "test_distributed_train.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist would otherwise order files by their test count
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a wall-clock test beside another worker measures its load
        alone = pytest.mark.skip(reason="timing-sensitive: runs with nothing beside it (pytest -m alone)")
        for item in items:
            if item.get_closest_marker("alone"):
                item.add_marker(alone)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- simulator-level setups --------------------------------------------------------------------------
def make_batches(n, dtype=torch.float32, batch=6, size=16, classes=5, seed=0):
    """``n`` minibatches of ``batch`` random ``size`` x ``size`` RGB images with labels in [0, classes)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 3, size, size, generator=g, dtype=dtype), torch.randint(0, classes, (batch,), generator=g))
        for _ in range(n)
    ]


def make_model(arch="revnet18", dtype=torch.float32, seed=0, method=None, aux_head=None):
    """``arch`` of width 4 for 5 classes, initialised from ``seed``; auxiliary heads where ``method``
    needs them (local learning), or as ``aux_head`` says."""
    torch.manual_seed(seed)
    if aux_head is None and method is not None and METHODS[method].needs_aux:
        aux_head = "cnn"
    return build_model(arch, num_classes=5, width=4, aux_head=aux_head).to(dtype)


def resumed(pipe, model, tick: int, fresh_model, pipeline):
    """``pipe`` (training ``model``) run to ``tick``, saved through ``torch.save`` as a run saves it,
    and loaded into ``fresh_model()`` (other weights, all replaced) and ``pipeline(model)``: the
    resumed (model, pipeline)."""
    pipe.run(ticks=tick)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "pipeline": pipe.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    model = fresh_model()
    model.load_state_dict(saved["model"])
    pipe = pipeline(model)
    pipe.load_state_dict(saved["pipeline"])
    return model, pipe


# ---- tiny `petra train` runs -------------------------------------------------------------------------
TINY_RUN = dict(arch="revnet18", width=4, dataset="synthetic", epochs=2, threads=1, progress=False)


def tiny_run(**overrides):
    """A ``petra train`` config: 2 epochs of a width-4 revnet18 on the synthetic task, one thread, no
    progress bar; ``overrides`` (the data set's size, the batch size, ...) are each test file's own."""
    return {**TINY_RUN, **overrides}


def argv(config):
    """``config`` as ``petra train`` arguments: ``key=value``, in order."""
    return [f"{k}={v}" for k, v in config.items()]


def untimed(records):
    """A run record (metrics.json, one history.json entry), or a list of them, without the ``TIMING`` keys."""
    if isinstance(records, dict):
        return {k: v for k, v in records.items() if k not in TIMING}
    return [untimed(r) for r in records]


def whole_and_resumed(config, tmp_path, signal_at="0:11:SIGINT"):
    """``petra train`` of ``config`` (arguments) once whole and once stopped by ``signal_at``
    (``--fault-at``) and resumed; the two run directories."""
    from petra_core.cli import main

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["train", *config, "--run-dir", str(whole)]) == 0
    assert main(["train", *config, "--run-dir", str(cut), "--fault-at", signal_at]) == 130
    assert main(["train", *config, "--run-dir", str(cut)]) == 0
    return whole, cut


class BeforeStep(Observer):
    """Calls ``fn(worker)`` right before each optimizer step, with the gradient about to be applied."""

    def __init__(self, fn):
        self.fn = fn

    def before(self, phase: str, worker, mb: int | None) -> None:
        if phase == "step":
            self.fn(worker)


def batches_tracked(module: nn.Module) -> list[int]:
    """num_batches_tracked of every batch-norm layer (one update per minibatch is checked)."""
    return [int(m.num_batches_tracked) for m in module.modules() if isinstance(m, _BatchNorm)]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a launch that names its own port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- distributed failures ----------------------------------------------------------------------------
def named_failed(err: str) -> set[int]:
    """The ranks a failure message names as failed: ``stage 7 (rank 2) failed``, ``rank 2 (stages
    7-9) failed`` or ``rank 2 failed`` (a rank that stopped because of it is not one of them)."""
    found = re.findall(r"\(rank (\d+)\) failed|\brank (\d+)(?: \([^)]*\))? failed", err)
    return {int(a or b) for a, b in found}


SMALL = ("--width", "4", "--image-size", "16")  # the rank program's smallest model and images


def rank_argv(steps: int, *extra: str) -> list[str]:
    """The rank program's arguments (tests/harness/ranks.py) for a tiny RevNet18 run of ``steps``
    minibatches of 4, one thread, then ``extra``."""
    return [
        *("--arch", "revnet18", "--num-classes", "5", "--batch", "4", "--steps", str(steps)),
        *("--threads", "1", "--lr", "0.05", "--timeout", "60"),
        *extra,
    ]


@pytest.fixture
def deterministic_gpu():
    """Deterministic kernels for a bit-for-bit comparison of two GPU runs (cuDNN's nondeterministic
    algorithms would part two runs of the same code), restored after."""
    from petra_core.precision import numerics, set_numerics

    saved = numerics()
    set_numerics("fp32", True)
    yield
    torch.use_deterministic_algorithms(saved["deterministic_algorithms"], warn_only=True)
    torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved["tf32_matmul"], saved["tf32_cudnn"]
