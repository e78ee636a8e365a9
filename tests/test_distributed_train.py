"""``petra train ... runtime=distributed``: the trainer over one process per rank.

* 2 ranks under torchrun end with the simulator's run bit for bit: every tensor of the final
  model (buffers included), history.json and metrics.json (timing keys excluded);
* signals at two mid-epoch ticks — SIGTERM to rank 1 at tick 16 (messages in flight both ways:
  each rank checkpoints the ones sent to it), SIGINT to rank 0 at tick 28 (after epoch 1's
  record) — stop every rank at the same tick with a checkpoint; resuming twice gives the
  uninterrupted run bit for bit;
* resuming with another number of ranks, and ``runtime=distributed`` outside torchrun, are
  refused with one line;
* a mesh of 2 replicas × 2 pipeline positions (4 ranks), interrupted on one rank and resumed,
  ends with the simulator's 2-replica run bit for bit; its checkpoint parts are named by mesh
  coordinate; the simulator's own 2-replica run resumes exactly too.

Ranks are plain subprocesses on 127.0.0.1 (gloo, one thread each, like the simulator here).
Most of the time is process start-up (importing torch); the runs themselves take ~2 s.
"""

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed
from conftest import argv, free_port, named_failed, tiny_run, untimed

from petra_core.cli import main
from petra_core.engine.launch import launch_local
from petra_core.run import runio

# PETRA with k=2, 8 minibatches of 16 an epoch: 34 ticks in all
TINY = argv(tiny_run(synthetic_train=128, synthetic_test=64, batch_size=16, k=2, method="petra"))
DIST = [*TINY, "runtime=distributed", "dist_timeout=60"]


def outcome(run):
    history = [untimed(r) for r in json.loads((run / "history.json").read_text())]
    metrics = untimed(json.loads((run / "metrics.json").read_text()))
    return history, metrics, runio.load_checkpoint(run / "checkpoint.pt")["model"]


def assert_same_run(a, b):
    (ha, ma, wa), (hb, mb, wb) = outcome(a), outcome(b)
    assert ha == hb and ma == mb
    assert list(wa) == list(wb)
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    run = tmp_path_factory.mktemp("sim") / "run"
    assert main(["train", *TINY, "--run-dir", str(run)]) == 0
    return run


def petra_train(run, nprocs, signal_at=""):
    fault = ["--fault-at", signal_at] if signal_at else []
    procs = launch_local(
        ["train", *DIST, "--run-dir", str(run), *fault], nprocs, timeout=120, capture=True, module="petra_core.cli"
    )
    return [p.returncode for p in procs], [p.err for p in procs]


@pytest.mark.slow
def test_two_ranks_under_torchrun_match_the_simulator(tmp_path, simulated):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "petra_core.cli",
        "train",
        *DIST,
        "--run-dir",
        str(run),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("top-1") == 1  # rank 0 reports
    assert_same_run(run, simulated)
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 2 and env["placement"] == "0-4,5-9" and env["torch_threads"] == 1
    assert sorted(p.name for p in (run / "checkpoint-parts").iterdir()) == [
        "replica0-position0-tick34.pt",
        "replica0-position1-tick34.pt",
    ]


@pytest.mark.slow
def test_the_authors_warmup_clock_on_ranks_matches_the_simulator(tmp_path):
    """warmup_clock=call ramps every stage by the calls of the ticks its steps fall in (optim.py):
    the same on two gloo ranks as in one process, and not the per-step clock's run."""
    clock = ["warmup_epochs=2", "warmup_clock=call"]
    simulated, ranks, per_step = tmp_path / "sim", tmp_path / "ranks", tmp_path / "step"
    assert main(["train", *TINY, *clock, "--run-dir", str(simulated)]) == 0
    assert main(["train", *TINY, "warmup_epochs=2", "--run-dir", str(per_step)]) == 0
    procs = launch_local(
        ["train", *DIST, *clock, "--run-dir", str(ranks)], 2, timeout=120, capture=True, module="petra_core.cli"
    )
    assert [p.returncode for p in procs] == [0, 0], [p.err[-2000:] for p in procs]
    assert_same_run(ranks, simulated)
    assert outcome(simulated)[0] != outcome(per_step)[0]  # the clock changes the run


@pytest.mark.slow
def test_weight_prediction_on_ranks_matches_the_simulator(tmp_path):
    """Each rank's stages forward at their predicted weights (methods/prediction.py) and checkpoint
    their last update: two gloo ranks end with the one-process run's bits."""
    simulated, ranks = tmp_path / "sim", tmp_path / "ranks"
    assert main(["train", *TINY, "weight_prediction=1", "--run-dir", str(simulated)]) == 0
    procs = launch_local(
        ["train", *DIST, "weight_prediction=1", "--run-dir", str(ranks)],
        2,
        timeout=120,
        capture=True,
        module="petra_core.cli",
    )
    assert [p.returncode for p in procs] == [0, 0], [p.err[-2000:] for p in procs]
    assert_same_run(ranks, simulated)


@pytest.mark.slow
def test_interrupted_run_resumes_bit_for_bit(tmp_path, simulated, capsys, monkeypatch):
    run = tmp_path / "run"
    signals = "1:16:SIGTERM,0:28:SIGINT"

    codes, errs = petra_train(run, 2, signals)
    assert codes == [130, 130], errs
    assert "petra: stopped: SIGTERM (rank 1) at tick 16; checkpoint written to" in errs[0]
    assert errs[1].strip() == ""  # rank 0 speaks for the run
    parts = {r: runio.load_checkpoint(run / "checkpoint-parts" / f"replica0-position{r}-tick16.pt") for r in (0, 1)}
    ready = {r: parts[r]["pipeline"]["world"]["ready"] for r in (0, 1)}
    assert ready[0] and ready[1], ready  # a backward message for rank 0, a forward one for rank 1
    assert not (run / "metrics.json").exists() and not (run / "history.json").exists()

    # another number of ranks is refused, with one line
    code = main(["train", *DIST, "--run-dir", str(run)])  # outside torchrun: told how to launch
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "torchrun --nproc-per-node=2 -m petra_core.cli train" in err[0], err
    with monkeypatch.context() as env:  # one rank, in this process
        env.setenv("RANK", "0"), env.setenv("WORLD_SIZE", "1"), env.setenv("LOCAL_RANK", "0")
        env.setenv("MASTER_ADDR", "127.0.0.1"), env.setenv("MASTER_PORT", str(free_port()))
        code = main(["train", *DIST, "--run-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        f"petra: error: {run / 'checkpoint.pt'} was written by 2 ranks, this launch has 1; "
        "resume with torchrun --nproc-per-node=2"
    ], err
    assert not torch.distributed.is_initialized()

    codes, errs = petra_train(run, 2, signals)
    assert codes == [130, 130], errs
    assert "resuming at tick 16 of 34 (epoch 0)" in errs[0] and "SIGINT (rank 0) at tick 28" in errs[0]
    assert len(json.loads((run / "history.json").read_text())) == 1

    codes, errs = petra_train(run, 2, signals)
    assert codes == [0, 0], errs
    assert "resuming at tick 28 of 34 (epoch 1)" in errs[0]
    assert_same_run(run, simulated)
    assert sorted(p.name for p in (run / "checkpoint-parts").iterdir()) == [
        "replica0-position0-tick34.pt",
        "replica0-position1-tick34.pt",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "when,tick",
    [("at start-up", "start"), ("between two ticks", "5"), ("after the last tick, during the final drain", "34")],
)
def test_a_dead_rank_is_named_by_every_survivor(tmp_path, when, tick):
    """Rank 1 of 3 (stages 4-6) dies (SIGKILL) {when}: ranks 0 and 2 exit non-zero and their
    message names rank 1 and its stages as failed, and no other rank (heartbeats in the rendezvous
    store tell who is gone, and a rank that left on its own said so there)."""
    procs = launch_local(
        ["train", *DIST, "dist_timeout=20", "--run-dir", str(tmp_path / "run"), "--fault-at", f"1:{tick}:SIGKILL"],
        3,
        timeout=120,
        capture=True,
        module="petra_core.cli",
    )
    assert procs[1].returncode == -9, procs[1].err
    for r in (0, 2):
        assert procs[r].returncode not in (0, None), (r, procs[r].err)
        lines = [line for line in procs[r].err.splitlines() if line.startswith("petra:")]
        assert lines and "rank 1" in lines[0] and ("stages 4-6" in lines[0] or tick == "start"), (when, procs[r].err)
        assert named_failed(procs[r].err) == {1}, (when, procs[r].err)  # the others stopped because of it


@pytest.fixture(scope="module")
def simulated_mesh(tmp_path_factory):
    run = tmp_path_factory.mktemp("sim-mesh") / "run"
    assert main(["train", *TINY, "replicas=2", "--run-dir", str(run)]) == 0
    return run


@pytest.mark.slow
def test_a_2x2_mesh_interrupted_and_resumed_matches_the_simulator(tmp_path, simulated_mesh):
    run = tmp_path / "run"
    argv = ["train", *DIST, "replicas=2", "--run-dir", str(run)]
    procs = launch_local([*argv, "--fault-at", "3:10:SIGTERM"], 4, timeout=150, capture=True, module="petra_core.cli")
    assert [p.returncode for p in procs] == [130] * 4, [p.err for p in procs]
    assert "SIGTERM (rank 3) at tick 10" in procs[0].err
    assert sorted(p.name for p in (run / "checkpoint-parts").iterdir()) == [
        f"replica{r}-position{p}-tick10.pt" for r in (0, 1) for p in (0, 1)
    ]
    procs = launch_local(argv, 4, timeout=150, capture=True, module="petra_core.cli")
    assert [p.returncode for p in procs] == [0] * 4, [p.err for p in procs]
    assert "resuming at tick 10" in procs[0].err
    assert_same_run(run, simulated_mesh)
    env = json.loads((run / "env.json").read_text())
    assert env["mesh"] == "2x2" and env["world_size"] == 4


@pytest.mark.slow
def test_the_simulators_replicas_resume_bit_for_bit(tmp_path, simulated_mesh, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *TINY, "replicas=2", "--run-dir", str(run), "--fault-at", "0:9:SIGINT"]) == 130
    assert main(["train", *TINY, "replicas=2", "--run-dir", str(run)]) == 0
    assert_same_run(run, simulated_mesh)
    history = json.loads((simulated_mesh / "history.json").read_text())
    assert len(history) == 2  # 8 minibatches an epoch: 4 for each replica


@pytest.mark.slow
def test_replicas_that_do_not_divide_the_ranks_are_refused(tmp_path):
    procs = launch_local(
        ["train", *DIST, "replicas=3", "--run-dir", str(tmp_path / "run")],
        2,
        timeout=120,
        capture=True,
        module="petra_core.cli",
    )
    assert all(p.returncode == 2 for p in procs), [p.err for p in procs]
    assert "petra: error: replicas=3 must divide the number of ranks (2)" in procs[0].err


@pytest.mark.slow
def test_petra_train_starts_its_own_ranks_and_matches_the_simulator(tmp_path, simulated, capfd):
    """``petra train --ranks 2`` (the path it takes by itself with 2 GPUs; here gloo on CPU) starts
    2 ranks with runtime=distributed, waits for them, and ends with the simulator's run bit for bit."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "--ranks", "2", "--run-dir", str(run)]) == 0
    err = capfd.readouterr().err
    assert "petra: starting 2 ranks on this machine (gloo)" in err, err
    assert_same_run(run, simulated)
    env = json.loads((run / "env.json").read_text())
    assert env["runtime"] == "distributed" and env["world_size"] == 2 and env["backend"] == "gloo"


@pytest.mark.slow
def test_sigterm_to_petra_train_stops_its_ranks_with_a_checkpoint(tmp_path):
    """The launching process passes SIGTERM on: every rank stops at the same tick with a checkpoint,
    and the launch exits with the ranks' status (130)."""
    import signal
    import time

    run = tmp_path / "run"
    long = [*TINY, "epochs=40"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "petra_core.cli", "train", *long, "--ranks", "2", "--run-dir", str(run)],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 90
    while not (run / "history.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the first epoch's record: both ranks are training
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert "petra: stopped: SIGTERM (rank " in err and "checkpoint written to" in err, err
    assert runio.load_checkpoint(run / "checkpoint.pt")["world_size"] == 2


@pytest.mark.slow
def test_a_run_directory_ranks_cannot_make_ends_every_rank_with_one_line_and_the_file_error_status(tmp_path, capfd):
    """A file where the run directory should go: rank 0 cannot write it, every rank ends together
    as a file error (errno and path carried over), one line from rank 0, and the launch exits 4."""
    (tmp_path / "a-file").write_text("")
    assert main(["train", *TINY, "--ranks", "2", "--run-dir", str(tmp_path / "a-file" / "run")]) == 4
    err = [line for line in capfd.readouterr().err.splitlines() if not line.startswith("petra: starting")]
    run = tmp_path / "a-file" / "run"
    assert err == [f"petra: error: {run}: a part of this path is a file, not a directory; choose another path"]
