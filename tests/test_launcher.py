"""``petra train``'s launch decision (run/launcher.py), with fake device counts: one process, or
one rank per GPU; the exit status of a launch of ranks; the flags' one-line errors.

The launch itself (2 gloo ranks through ``petra train --ranks 2`` equal the simulator bit for bit;
SIGTERM to the launching process stops its ranks with a checkpoint) is in test_distributed_train.py.
"""

import pytest

from petra_core.cli import main
from petra_core.run.config import ConfigError
from petra_core.run.launcher import LaunchPlan, exit_status, plan_launch, stage_count


def plan(launch="auto", ranks=None, device="cuda", gpus=1, stages=10, replicas=1, under_torchrun=False):
    return plan_launch(
        launch, ranks, device=device, gpus=gpus, stages=stages, replicas=replicas, under_torchrun=under_torchrun
    )


def test_auto_starts_one_rank_per_gpu_only_with_several_gpus():
    assert plan(gpus=4) == LaunchPlan(4)
    assert plan(gpus=2) == LaunchPlan(2)
    assert plan(gpus=1) == LaunchPlan(0)  # one GPU: the simulator in this process
    assert plan(gpus=0) == LaunchPlan(0)
    assert plan(device="cpu", gpus=8) == LaunchPlan(0)  # cpu: one process unless --ranks asks
    assert plan(device="cpu", ranks=2) == LaunchPlan(2)  # --ranks alone means ranks (gloo)
    assert plan(gpus=4, ranks=2) == LaunchPlan(2)


def test_process_and_torchrun_train_here():
    assert plan("process", gpus=8) == LaunchPlan(0)
    assert plan(gpus=8, under_torchrun=True) == LaunchPlan(0)  # already one of torchrun's ranks
    assert plan("ranks", ranks=2, gpus=1, device="cpu") == LaunchPlan(2)


def test_auto_fits_the_ranks_to_the_stages_and_replicas():
    got = plan(gpus=8, stages=3)
    assert got.ranks == 3 and "using 3 of 8 GPUs" in got.note
    assert plan(gpus=8, stages=3, replicas=2).ranks == 6
    assert plan(gpus=4, replicas=2) == LaunchPlan(4)  # 2 replicas x 2 positions
    got = plan(gpus=3, replicas=2)  # 3 GPUs, 2 replicas: 2 ranks, one GPU left idle
    assert got.ranks == 2 and "using 2 of 3 GPUs" in got.note
    got = plan(gpus=2, stages=1)  # nothing to pipeline: here
    assert got.ranks == 0 and "training in this process" in got.note


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(launch="fast"), "--launch 'fast' is not allowed; allowed: auto, process, ranks"),
        (dict(ranks=0), "--ranks 0 must be >= 1"),
        (dict(launch="process", ranks=2), "--ranks 2 starts ranks but --launch process trains in this process"),
        (dict(launch="ranks", device="cpu"), "--launch ranks on device=cpu needs --ranks N"),
        (dict(launch="ranks", gpus=0), "no GPU is visible; use device=cpu --ranks N"),
        (dict(ranks=4, gpus=2), "--ranks 4 needs 4 GPUs (one rank per GPU), 2 visible"),
        (dict(ranks=3, gpus=4, replicas=2), "3 ranks for replicas=2: the ranks must be a multiple of the replicas"),
        (dict(ranks=4, gpus=4, stages=3), "4 ranks hold 4 pipeline positions per replica but the model has 3"),
        (dict(launch="ranks", gpus=8, stages=3), "8 ranks hold 8 pipeline positions"),
        (dict(ranks=2, under_torchrun=True), "torchrun already started the ranks"),
    ],
)
def test_bad_requests_are_one_line(kw, message):
    with pytest.raises(ConfigError, match=None) as err:
        plan(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_exit_status_is_the_first_failing_ranks():
    assert exit_status([0, 0]) == 0
    assert exit_status([0, 130]) == 130
    assert exit_status([1, 2]) == 1
    assert exit_status([-9, 1]) == 137  # killed by SIGKILL: 128 + 9


def test_stage_count_builds_nothing_real():
    assert stage_count("revnet18", 64) == 10 and stage_count("resnet50", 64) == 18


def test_the_cli_refuses_a_bad_launch_in_one_line(capsys, tmp_path):
    code = main(["train", "device=cpu", "--launch", "process", "--ranks", "2", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "petra: error: --ranks 2 starts ranks but --launch process trains in this process; drop one"
    ], err
