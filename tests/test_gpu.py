"""GPU stage execution: a tick never waits for the device; the GPU lane.

The first test runs everywhere: it traces one pipeline tick on the CPU and checks that the host
launches every stage's work in stage order without a single call that would wait for a GPU
(``.item()``, ``.tolist()``, ``float(t)``, ``bool(t)``, ``.cpu()``, ...). Tests marked ``gpu``
run where CUDA is visible (``pytest -m gpu``) and are skipped, with the reason, elsewhere:

* the CPU and CUDA simulators agree: float64 to 1e-10, float32 (TF32 off) to 1e-4 relative;
* the zero-staleness oracle holds on CUDA for every method;
* with 2 or more GPUs: stages are placed in contiguous blocks, and two GPUs run a tick faster
  than one (their work overlaps); the NCCL pipeline on 2 ranks equals the simulator;
  the one-process simulator on 2 GPUs equals the 1-GPU run bit for bit; ``petra train device=cuda``
  starts one NCCL rank per GPU by itself and ends like the 1-GPU run;
* no host synchronisation inside a tick (``torch.cuda.set_sync_debug_mode("error")``).
"""

import copy
import json
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import BeforeStep, make_batches, make_model
from torch.overrides import TorchFunctionMode

from petra_core import METHODS, Pipeline, Recipe, Simulator, build_model
from petra_core.engine import LocalWorld, PipelineSpec

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0


def gpu_lane(test):
    return pytest.mark.gpu(
        pytest.mark.skipif(
            not CUDA, reason="no CUDA device visible: the GPU lane runs on a machine with one (pytest -m gpu)"
        )(test)
    )


def multi_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(GPUS < 2, reason=f"needs 2 or more GPUs, {GPUS} visible")(test))


LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)
WAITS = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy", "nonzero", "synchronize"}


class Trace(TorchFunctionMode):
    """Records every torch call that would make the host wait for a device."""

    def __init__(self):
        super().__init__()
        self.waits: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in WAITS:
            self.waits.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", METHODS)
def test_a_tick_never_waits_for_the_device(method):
    data = make_batches(30)
    sim = Simulator(
        make_model(method=method), method, num_batches=30, get_batch=data.__getitem__, batch_size=6, k=2, recipe=LR
    )
    order = []
    for w in sim.workers:
        for phase in ("forward", "backward"):
            inner = getattr(w, phase)
            setattr(w, phase, lambda *a, w=w, phase=phase, inner=inner: (order.append((w.index, phase)), inner(*a))[1])
    sim.run(25)  # past the pipeline's fill: every stage forwards and backwards in a tick
    order.clear()
    with Trace() as trace:
        sim.advance()
    assert trace.waits == [], f"{method}: the host waited for the device in a tick: {trace.waits}"
    stages = [j for j, _ in order]
    assert stages == sorted(stages), order  # launched in stage order
    if not sim.schedule.fixed_weights_in_flight:
        assert set(stages) == set(range(len(sim.workers))), order  # every stage has work in a full tick
    assert len(sim.head_log) > 0  # reading the log (outside a tick) is where the host waits, once


# ---- the GPU lane ------------------------------------------------------------------------------------
def train_on(device, dtype, method="petra"):
    data = make_batches(12, dtype)
    model = make_model(dtype=dtype).to(device)
    Simulator(model, method, num_batches=12, get_batch=data.__getitem__, batch_size=6, k=2, recipe=LR).run()
    return {k: v.cpu() for k, v in model.state_dict().items()}


@gpu_lane
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("method", ["backprop", "petra"])
def test_cpu_and_cuda_simulators_agree(method, dtype, tol, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cpu, cuda = train_on("cpu", dtype, method), train_on("cuda", dtype, method)
    for name, a in cpu.items():
        if a.is_floating_point():
            err = float((cuda[name] - a).norm() / a.norm().clamp_min(1e-30))
            assert err < tol, f"{method} {dtype}: {name} differs by {err:.1e} (relative)"


@gpu_lane
@pytest.mark.parametrize("method", [name for name, m in METHODS.items() if not m.needs_aux])
def test_zero_staleness_oracle_on_cuda(method):
    data = [(x.cuda(), y.cuda()) for x, y in make_batches(6, torch.float64)]
    model = make_model(dtype=torch.float64).cuda()
    reference = copy.deepcopy(model)
    for x, y in data:
        (F.cross_entropy(reference(x), y) / 2).backward()
    sim = Simulator(
        model,
        method,
        num_batches=6,
        get_batch=data.__getitem__,
        batch_size=6,
        k=2,
        recipe=Recipe(base_lr=0.0, scale_lr=False),
    )
    sums = [None] * len(model)

    def hook(w):
        g = torch.cat([p.grad.flatten() for p in w.stage.parameters()]).clone()
        sums[w.index] = g if sums[w.index] is None else sums[w.index] + g

    sim.observers.append(BeforeStep(hook))
    sim.run()
    for j, stage in enumerate(reference):
        true = torch.cat([p.grad.flatten() for p in stage.parameters()])
        assert float((sums[j] - true).norm() / true.norm()) < 1e-10, f"{method} stage {j}"


@gpu_lane
def test_no_host_sync_inside_a_cuda_tick():
    data = [(x.pin_memory(), y.pin_memory()) for x, y in make_batches(30)]
    sim = Simulator(
        make_model().cuda(), "petra", num_batches=30, get_batch=data.__getitem__, batch_size=6, k=2, recipe=LR
    )
    sim.run(25)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sim.advance()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def pipeline_on(devices, width=64, size=32, batch=64, n=60):
    data = [(x.pin_memory(), y.pin_memory()) for x, y in make_batches(n, batch=batch, size=size)]
    model = build_model("revnet18", num_classes=10, width=width)
    return Pipeline.build(
        PipelineSpec(
            model=model,
            method="petra",
            world=LocalWorld(devices=devices),
            num_batches=n,
            get_batch=data.__getitem__,
            batch_size=batch,
            recipe=LR,
        )
    )


@multi_gpu
def test_stages_spread_over_gpus_and_their_work_overlaps():
    devices = [torch.device("cuda", i) for i in range(GPUS)]
    spread = pipeline_on(devices)
    where = [w.device.index for w in spread.workers]
    assert where == sorted(where) and set(where) == set(range(GPUS)), where  # contiguous blocks, every GPU

    def seconds_per_tick(pipe):
        pipe.run(25)
        torch.cuda.synchronize()
        start = time.perf_counter()
        pipe.run(20)
        for d in devices:
            torch.cuda.synchronize(d)
        return (time.perf_counter() - start) / 20

    one, many = seconds_per_tick(pipeline_on(devices[:1])), seconds_per_tick(spread)
    assert many < 0.85 * one, f"{GPUS} GPUs: {many * 1e3:.1f} ms per tick, one GPU: {one * 1e3:.1f} ms (no overlap?)"


@pytest.mark.slow
@multi_gpu
def test_nccl_pipeline_equals_the_simulator(tmp_path):
    from harness.ranks import RANKS, demo_setup, parser

    from petra_core.engine.launch import launch_local

    argv = [
        "--arch",
        "revnet18",
        "--num-classes",
        "5",
        "--batch",
        "4",
        "--steps",
        "10",
        "--width",
        "4",
        "--image-size",
        "16",
        "--method",
        "petra",
        "--device",
        "cuda",
        "--timeout",
        "60",
        "--save",
        str(tmp_path / "{method}.pt"),
    ]
    procs = launch_local(argv, 2, timeout=300, capture=True, script=RANKS)
    assert all(p.returncode == 0 for p in procs), [p.err[-2000:] for p in procs]
    args = parser().parse_args(argv)
    model, get_batch, recipe = demo_setup(args)
    model.cuda()
    Simulator(model, "petra", num_batches=args.steps, get_batch=get_batch, batch_size=args.batch, recipe=recipe).run()
    saved = torch.load(tmp_path / "petra.pt")
    for name, a in model.state_dict().items():
        b = saved[name].to(a.device)
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), f"{name}: NCCL pipeline differs from the simulator"


def test_the_gpu_benchmark_runs(tmp_path):
    """bench_gpu.py is the one prepared script for a lent GPU: keep it working (a CPU smoke run)."""
    sys_path = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, sys_path)
    try:
        import bench_gpu

        out = bench_gpu.main(
            ["--device", "cpu", "--quick", "--inject-oom", "delayed", "--settings", "training", "--out", str(tmp_path)]
        )  # the default method list: every method
    finally:
        sys.path.remove(sys_path)
        sys.modules.pop("bench_gpu", None)
    from petra_core import METHODS

    assert [r["method"] for r in out["rows"]] == list(METHODS)
    oom = [r for r in out["rows"] if r.get("oom")]
    assert [r["method"] for r in oom] == ["delayed"] and oom[0]["tried_bytes"] == 2**40
    assert not any(r.get("error") and not r.get("oom") for r in out["rows"]), out["rows"]
    assert all(r["host_s_per_tick"] > 0 for r in out["rows"] if not r.get("oom"))
    assert "petra_over_backprop_step" in out["ratios"][0]
    (written,) = tmp_path.glob("*.json")
    assert json.loads(written.read_text())["rows"] == out["rows"]

    # Table 1's GPU section renders what the benchmark wrote (here a CPU's rows stand in for a GPU's)
    from petra_core.report import costs as costs_mod
    from petra_core.report import gpu, tables

    context = tables.table1_context(costs_mod.load(Path(__file__).resolve().parents[1] / "results/costs"))
    md = tables.render("table1_costs", "md", {**context, "gpu": gpu.gpu_context(gpu.load(tmp_path))})
    petra = next(r for r in out["rows"] if r["method"] == "petra")
    backprop = next(r for r in out["rows"] if r["method"] == "backprop")
    ratio = petra["s_per_batch"] / backprop["s_per_batch"]
    assert f"| RevNet18 | cifar | training | PETRA | {1e3 * petra['s_per_batch']:.1f} | {ratio:.2f} |" in md, md
    assert "| Delayed (weight stash) | out of memory | – | – | tried 1024.00 |" in md
    assert "No GPU has measured" in tables.render("table1_costs", "md", {**context, "gpu": gpu.gpu_context([])})
    assert "\\begin{tabular}{llllrrrr}" in tables.render(
        "table1_costs", "tex", {**context, "gpu": gpu.gpu_context(gpu.load(tmp_path))}
    )


# ---- machines with several GPUs: local slots, SLURM ----------------------------------------------
def test_with_gpus_gives_each_claimant_gpus_of_its_own(tmp_path):
    from petra_core.workflow.gpus import claim

    gpus = ["0", "1", "2"]
    first, held = claim(2, gpus, tmp_path, wait=0)
    second, held2 = claim(1, gpus, tmp_path, wait=0)
    assert first == ["0", "1"] and second == ["2"]
    with pytest.raises(ValueError, match="no 1 free GPU"):
        claim(1, gpus, tmp_path, wait=0)
    import os

    for fd in held:  # the first run ends: its GPUs are free again
        os.close(fd)
    assert claim(2, gpus, tmp_path, wait=0)[0] == ["0", "1"]
    with pytest.raises(ValueError, match="only 3 GPU"):
        claim(4, gpus, tmp_path, wait=0)


@pytest.mark.slow
def test_with_gpus_runs_the_command_on_its_gpus(tmp_path, monkeypatch):
    import subprocess

    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "4,5", "PETRA_GPU_LOCKS": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "petra_core.cli",
            "with-gpus",
            "1",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "4"


def test_the_slurm_profile_asks_for_the_cpus_a_run_uses():
    import yaml

    profile = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/profiles/slurm/config.yaml").read_text())
    train = {**profile["default-resources"], **profile["set-resources"]["train"]}
    assert train["cpus_per_task"] == profile["set-threads"]["train"]  # not the default's 1
    assert "cpus_per_gpu" not in train  # SLURM refuses it beside --cpus-per-task


@pytest.mark.slow
def test_the_first_contact_script_runs_every_part_on_cpu(tmp_path):
    """benchmarks/gpu_first_contact.sh in its CPU smoke mode: every part runs under its own timeout
    and leaves its log and status; the interrupted run resumes to the end."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "QUICK": "1", "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu_first_contact.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    status = dict(line.split("\t")[:2] for line in (tmp_path / "status.tsv").read_text().splitlines()[1:])
    assert status == {
        "env": "0",
        "bench": "0",
        "precision": "0",
        "resume_interrupted": "130",
        "resume_finished": "0",
        "train_bf16": "0",
        "loader": "0",
    }
    assert "precision: bf16" in (tmp_path / "bf16" / "run" / "config.yaml").read_text()
    settings = {r["settings"] for r in json.loads(next((tmp_path / "bench").glob("*.json")).read_text())["rows"]}
    assert settings == {"training", "bf16"}
    assert "resuming at tick 20" in (tmp_path / "resume_finished.log").read_text()
    assert (tmp_path / "resume" / "run" / "metrics.json").exists() and list((tmp_path / "bench").glob("*.json"))
    assert json.loads((tmp_path / "env.json").read_text())["torch"] == torch.__version__


def test_the_first_contact_script_stops_within_its_budget(tmp_path):
    """Every part's timeout is cut to what is left of BUDGET; parts past it are skipped, named."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "QUICK": "1", "PYTHON": sys.executable, "BUDGET": "5"}
    out = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu_first_contact.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("\t") for line in (tmp_path / "status.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == [
        "env",
        "bench",
        "precision",
        "resume_interrupted",
        "resume_finished",
        "train_bf16",
        "loader",
    ]
    assert all(r[1] == "skipped" for r in rows) and "budget is spent" in out.stdout


def _cuda_run(tmp_path, name, *extra, env=None):
    """A tiny ``petra train device=cuda`` run in a fresh process; its final model."""
    import os
    import subprocess

    from conftest import argv, tiny_run

    from petra_core.run import runio

    run = tmp_path / name
    config = argv(tiny_run(synthetic_train=128, synthetic_test=64, batch_size=16, k=2, method="petra"))
    cmd = [sys.executable, "-m", "petra_core.cli", "train", *config, "device=cuda", *extra, "--run-dir", str(run)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return runio.load_checkpoint(run / "checkpoint.pt")["model"], out.stderr


@pytest.mark.slow
@multi_gpu
def test_the_simulator_on_two_gpus_equals_one_gpu_bit_for_bit(tmp_path):
    """One process, stages on 2 GPUs (messages copied between them on copy streams, handed over with
    events; labels from the host straight to the head's GPU): the same bits as on one GPU
    (deterministic algorithms, the same kernels on both)."""
    one, _ = _cuda_run(tmp_path, "one", "--launch", "process", env={"CUDA_VISIBLE_DEVICES": "0"})
    two, _ = _cuda_run(tmp_path, "two", "--launch", "process", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    differ = [k for k in one if not torch.equal(one[k], two[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"


@pytest.mark.slow
@multi_gpu
def test_petra_train_on_two_gpus_starts_one_nccl_rank_per_gpu(tmp_path):
    """With 2 GPUs ``petra train device=cuda`` starts 2 ranks on NCCL by itself; the run ends like
    the one-GPU simulator's (to 1e-6: NCCL ranks are separate processes, not asserted bit-exact)."""
    one, _ = _cuda_run(tmp_path, "one", env={"CUDA_VISIBLE_DEVICES": "0"})
    ranks, err = _cuda_run(tmp_path, "ranks", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "petra: starting 2 ranks on this machine (one per GPU, NCCL)" in err, err
    env = json.loads((tmp_path / "ranks" / "env.json").read_text())
    assert env["backend"] == "nccl" and env["world_size"] == 2
    for name, a in one.items():
        assert torch.allclose(a.float(), ranks[name].float(), rtol=1e-6, atol=1e-7), name
