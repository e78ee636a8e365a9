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
* no host synchronisation inside a tick (``torch.cuda.set_sync_debug_mode("error")``);
* replaying a plain RevNet18 step as one CUDA graph beats eager (``benchmarks/probes/gpu_limit.py``).

The probes that made the committed H200 evidence (``benchmarks/probes/``) also run on the CPU (slow).
"""

import contextlib
import copy
import importlib
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


@contextlib.contextmanager
def benchmark(name: str):
    """Module ``name`` of benchmarks/ (imported as the scripts import each other), forgotten after."""
    where = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, where)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(where)
        for mod in ("bench_gpu", "host_calls", "phase_times", name):
            sys.modules.pop(mod, None)


def test_the_gpu_benchmark_runs(tmp_path):
    """bench_gpu.py is the one prepared script for a lent GPU: keep it working (a CPU smoke run)."""
    with benchmark("bench_gpu") as bench_gpu:
        out = bench_gpu.main(
            ["--device", "cpu", "--quick", "--inject-oom", "delayed", "--settings", "training", "--out", str(tmp_path)]
        )  # the default method list: every method, after the plain loop
    assert [r["method"] for r in out["rows"]] == ["plain", *METHODS]
    assert {(r["batch"], r["phases"]) for r in out["rows"]} == {(4, "eager")}
    oom = [r for r in out["rows"] if r.get("oom")]
    assert [r["method"] for r in oom] == ["delayed"] and oom[0]["tried_bytes"] == 2**40
    assert not any(r.get("error") and not r.get("oom") for r in out["rows"]), out["rows"]
    measured = [r for r in out["rows"] if not r.get("oom")]
    assert all(r["host_s_per_tick"] > 0 and r["host_calls_per_tick"] > 0 for r in measured)
    # on a CPU the host is the device: host time per minibatch is the synced time
    assert all(r["host_over_synced"] == pytest.approx(1, rel=0.2) for r in measured)
    petra = next(r for r in out["rows"] if r["method"] == "petra")
    backprop = next(r for r in out["rows"] if r["method"] == "backprop")
    plain = out["rows"][0]
    assert plain["stage_held_bytes"] is None and "stage_device_ms" not in plain
    # every stage's phases, per minibatch: PETRA rebuilds every reversible stage's input
    assert len(petra["stage_device_ms"]) == petra["stages"] == len(petra["stage_host_ms"])
    assert all(set(s) >= {"forward", "backward", "step"} for s in petra["stage_device_ms"])
    assert all(s["rebuild"] > 0 for s in petra["stage_device_ms"][1:-1])
    assert 0 < sum(sum(s.values()) for s in petra["stage_device_ms"]) < 3e3 * petra["s_per_batch"]
    (ratio,) = out["ratios"]
    assert ratio["batch"] == 4 and ratio["phases"] == "eager" and "petra_over_backprop_step" in ratio
    assert ratio["backprop_over_plain"] == backprop["s_per_batch"] / plain["s_per_batch"]
    assert ratio["petra_over_plain"] == petra["s_per_batch"] / plain["s_per_batch"]
    (written,) = tmp_path.glob("*.json")
    assert json.loads(written.read_text())["rows"] == out["rows"]

    # Table 1's GPU section renders what the benchmark wrote (here a CPU's rows stand in for a GPU's)
    from petra_core.report import costs as costs_mod
    from petra_core.report import gpu, tables

    context = tables.table1_context(costs_mod.load(Path(__file__).resolve().parents[1] / "results/costs"))
    md = tables.render("table1_costs", "md", {**context, "gpu": gpu.gpu_context(gpu.load(tmp_path))})
    ratio = petra["s_per_batch"] / backprop["s_per_batch"]
    assert f"| RevNet18 | cifar | training | PETRA | {1e3 * petra['s_per_batch']:.1f} | {ratio:.2f} |" in md, md
    assert "| Delayed (weight stash) | out of memory | – | – | tried 1024.00 |" in md
    assert "No GPU has measured" in tables.render("table1_costs", "md", {**context, "gpu": gpu.gpu_context([])})
    assert "\\begin{tabular}{llllrrrr}" in tables.render(
        "table1_costs", "tex", {**context, "gpu": gpu.gpu_context(gpu.load(tmp_path))}
    )


def _probe(tmp_path, script: str, *args: str) -> str:
    """Run ``benchmarks/probes/SCRIPT`` as a reviewer would, from the project root; its stdout."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "probes" / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_gpu_probes_run_on_cpu(tmp_path):
    """The probes that made results/gpu/nvidia-h200/ keep working on the engine as it is (CPU smoke runs)."""
    _probe(tmp_path, "gpu_probe.py", "--device", "cpu", "--quick", "--out", "probe.json")
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["plain_vs_engine"] and not any("error" in r for r in probe["plain_vs_engine"]), probe
    assert all(r["backprop_over_plain"] > 0 for r in probe["plain_vs_engine"])
    _probe(tmp_path, "gpu_stage_profile.py", "--device", "cpu", "--quick", "--out", "stages.json")
    rows = json.loads((tmp_path / "stages.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"backprop", "petra", "dsp", "delayed"}
    assert not any("error" in r for r in rows), rows
    assert {r["method"]: r["ticks_per_minibatch"] for r in rows}["backprop"] == 2 * rows[0]["stages"] - 1
    out = _probe(tmp_path, "gpu_hostprof.py", "cpu", "8")
    assert "=== petra: host" in out and "=== backprop: host" in out


@gpu_lane
def test_the_graph_floor_probe_runs(tmp_path):
    """gpu_limit.py (CUDA only): replaying a plain RevNet18 step as one CUDA graph beats eager."""
    _probe(tmp_path, "gpu_limit.py", "--compile", "", "--out", "limit.json")
    rows = json.loads((tmp_path / "limit.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [64, 256]
    for r in rows:
        assert isinstance(r["eager_s"], float) and isinstance(r["graph_s"], float), r
        assert r["graph_s"] < r["eager_s"], r


def test_a_row_whose_phases_cannot_be_observed_keeps_its_times(tmp_path, monkeypatch):
    with benchmark("bench_gpu") as bench_gpu:

        def refuse(pipe, ticks, minibatches):
            raise RuntimeError("observers cannot watch a captured graph")

        monkeypatch.setattr(bench_gpu, "stage_phase_times", refuse)
        out = bench_gpu.main(
            ["--device", "cpu", "--quick", "--methods", "petra", "--settings", "training", "--out", str(tmp_path)]
        )
    petra = out["rows"][1]
    assert petra["stage_times_error"] == "RuntimeError: observers cannot watch a captured graph"
    assert petra["s_per_batch"] > 0 and "error" not in petra and "petra_over_plain" in out["ratios"][0]


@pytest.mark.parametrize(
    "argv,line",
    [
        (["--phases", "eager,warp"], "bench_gpu: unknown phases 'warp'; allowed: "),
        (["--batches", "64,0"], "bench_gpu: batch size '0' is not allowed; allowed: integers >= 1"),
        (["--settings", "fp8"], "bench_gpu: unknown setting 'fp8'; allowed: training, fastest, bf16"),
    ],
)
def test_the_gpu_benchmark_refuses_a_bad_value_in_one_line(argv, line, tmp_path):
    with benchmark("bench_gpu") as bench_gpu, pytest.raises(SystemExit) as err:
        bench_gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path), *argv])
    assert str(err.value).startswith(line) and "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())  # refused before any row


def test_host_calls_counts_a_known_functions_calls_exactly():
    def leaf(x):
        return abs(x)  # one C call

    def three_leaves():
        i = 0
        while i < 3:
            leaf(i)
            i += 1

    with benchmark("host_calls") as host_calls:
        assert host_calls.count_calls(three_leaves) == {"python_calls": 4, "c_calls": 3}
        assert host_calls.count_calls(three_leaves, repeat=5) == {"python_calls": 4, "c_calls": 3}
        assert host_calls.count_calls(lambda: None) == {"python_calls": 1, "c_calls": 0}
        # a skipped function is one call, without what it calls (what a graph replay stands for)
        assert host_calls.count_calls(three_leaves, skip=[leaf]) == {"python_calls": 4, "c_calls": 0}
        assert host_calls.count_calls(three_leaves, skip=[three_leaves]) == {"python_calls": 1, "c_calls": 0}
        with pytest.raises(ValueError, match="repeat must be an integer >= 1, got 0"):
            host_calls.count_calls(leaf, repeat=0)


def test_host_calls_of_a_tick_are_the_same_every_steady_tick():
    """The count steers the host's work without a GPU: it must not move between steady ticks."""
    torch.manual_seed(0)
    model = make_model()
    ((x, y),) = make_batches(1, batch=4)
    J = len(model)
    spec = PipelineSpec(
        model=model, method="petra", world=LocalWorld(), num_batches=6 * J, get_batch=lambda mb: (x, y), batch_size=4
    )
    pipe = Pipeline.build(spec)
    pipe.run(2 * J)
    with benchmark("host_calls") as host_calls:
        counts = [host_calls.count_calls(pipe.advance) for _ in range(3)]
    assert counts[0] == counts[1] == counts[2] and counts[0]["python_calls"] > 100


def test_phase_clock_times_every_phase_of_every_stage_in_ticks_of_its_own():
    """Per-stage phase times on a CPU: every stage, every phase it runs, and the observers leave the
    pipeline as they found it (a run with them differs in nothing it computes)."""
    torch.manual_seed(0)
    model = make_model()
    ((x, y),) = make_batches(1, batch=4)
    J = len(model)

    def build():
        m = copy.deepcopy(model)
        return Pipeline.build(
            PipelineSpec(
                model=m,
                method="petra",
                world=LocalWorld(),
                num_batches=4 * J,
                get_batch=lambda mb: (x, y),
                batch_size=4,
            )
        )

    pipe, reference = build(), build()
    pipe.run(2 * J)
    with benchmark("phase_times") as phase_times:
        times = phase_times.stage_phase_times(pipe, ticks=2, minibatches=2)
    assert pipe.observers == [] and pipe.tick == 2 * J + 4
    for key in ("stage_host_ms", "stage_device_ms"):
        assert len(times[key]) == J
        assert all(set(s) == {"forward", "send", "rebuild", "backward", "step"} for s in times[key][1:-1]), times[key]
        assert all(v > 0 for s in times[key] for v in s.values())
    reference.run(2 * J + 4)
    for a, b in zip(pipe.stage_state_dicts().values(), reference.stage_state_dicts().values()):
        assert all(torch.equal(a[k], b[k]) for k in a)


@gpu_lane
def test_a_phase_clock_on_a_gpu_times_the_device_not_the_launches():
    """A phase whose host launches 5 ms of device work over 10 ms: with the sleep ahead, its events
    time the device's 5 ms; without it, the stream waits for the host and they time its 10."""
    from types import SimpleNamespace

    device = torch.device("cuda", 0)
    worker = SimpleNamespace(index=0, replica=0, device=device)
    with benchmark("phase_times") as phase_times:
        rate = phase_times.sleep_cycles_per_s(device)
        assert 1e8 < rate < 1e11  # cycles per second: a GPU's clock, not a wrong unit
        spans = {}
        for ahead in (0.05, None):
            clock = phase_times.PhaseClock(device=True, ahead_s=ahead and {(0, "forward"): ahead}, cycles_per_s=rate)
            clock.before("forward", worker, 0)
            for _ in range(5):
                time.sleep(0.002)
                phase_times.cuda_sleep(device, 0.001, rate)
            clock.after("forward", worker, 0)
            ((key, spans[ahead]),) = clock.seconds()
    assert key == (0, "forward")
    assert spans[0.05] == pytest.approx(0.005, rel=0.25) and spans[None] > 0.009, spans


@gpu_lane
def test_phase_times_of_a_pipeline_on_a_gpu_add_up_to_at_most_its_synced_time():
    with benchmark("bench_gpu") as bench_gpu, bench_gpu.kept_settings():
        precision = bench_gpu.apply_settings("fastest")
        row = bench_gpu.measure(
            "revnet18",
            "cifar",
            32,
            10,
            "petra",
            device=torch.device("cuda", 0),
            width=64,
            batch=64,
            timed=6,
            precision=precision,
        )
    device_ms = sum(sum(s.values()) for s in row["stage_device_ms"])
    synced_ms = 1e3 * row["s_per_batch"]
    assert 0.05 * synced_ms < device_ms < 1.1 * synced_ms, (device_ms, synced_ms)
    assert row["host_over_synced"] > 0 and row["host_calls_per_tick"] > 100


@gpu_lane
def test_the_plain_loop_on_a_gpu_is_timed_like_the_engine():
    with benchmark("bench_gpu") as bench_gpu, bench_gpu.kept_settings():
        precision = bench_gpu.apply_settings("bf16")
        row = bench_gpu.measure_plain(
            "revnet18",
            "cifar",
            32,
            10,
            device=torch.device("cuda", 0),
            width=64,
            batch=64,
            timed=6,
            precision=precision,
            channels_last=True,
        )
    assert row["host_s_per_batch"] > 0 and 0 < row["s_per_batch"] < 1.0 and row["device_peak_bytes"] > 0
    assert row["host_calls_per_tick"] > 100


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


FIRST_CONTACT_PARTS = [
    "env",
    "bench",
    "cifar10_prepare",
    "cifar10_backprop",
    "cifar10_petra",
    "bench_imagenet",
    "precision",
    "resume_interrupted",
    "resume_finished",
    "train_bf16",
    "loader",
    "cifar10_delayed",
    "cifar10_dsp",
]


@pytest.mark.slow
def test_the_first_contact_script_runs_every_part_on_cpu(tmp_path):
    """benchmarks/gpu_first_contact.sh in its CPU smoke mode: every part runs under its own timeout
    and leaves its log and status; the interrupted run resumes to the end; everything it wrote is in
    one archive, beside status.tsv and nothing else."""
    import os
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "QUICK": "1", "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu_first_contact.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first_contact.tar.gz", "status.tsv"]
    status = dict(line.split("\t")[:2] for line in (tmp_path / "status.tsv").read_text().splitlines()[1:])
    tarball = any((root / d / "cifar10-jpeg.tar.gz").is_file() for d in ("../shared/data", "shared/data"))
    cifar = "0" if tarball else "skipped"  # a clone without the data skips the real epochs, named
    assert status == {
        **{name: cifar for name in FIRST_CONTACT_PARTS if name.startswith("cifar10")},
        "env": "0",
        "bench": "0",
        "bench_imagenet": "0",
        "precision": "0",
        "resume_interrupted": "130",
        "resume_finished": "0",
        "train_bf16": "0",
        "loader": "0",
    }
    assert list(status) == FIRST_CONTACT_PARTS
    with tarfile.open(tmp_path / "first_contact.tar.gz") as archive:
        archive.extractall(tmp_path / "x", filter="data")
    got = tmp_path / "x" / "first_contact"
    assert (got / "status.tsv").read_text() == (tmp_path / "status.tsv").read_text()
    assert not list(got.rglob("checkpoint*"))  # runs' checkpoints stay out of the archive
    assert "precision: bf16" in (got / "bf16" / "run" / "config.yaml").read_text()
    bench = json.loads(next((got / "bench").glob("*.json")).read_text())
    assert {r["settings"] for r in bench["rows"]} == {"training", "bf16"}
    assert {r["method"] for r in bench["rows"]} >= {"plain", "backprop", "petra"}
    imagenet = json.loads(next((got / "bench_imagenet").glob("*.json")).read_text())
    assert {(r["arch"], r["stem"], r["method"]) for r in imagenet["rows"]} == {
        ("revnet50", "imagenet", m) for m in ("plain", "backprop", "petra")
    }
    assert "resuming at tick 20" in (got / "resume_finished.log").read_text()
    assert (got / "resume" / "run" / "metrics.json").exists()
    assert json.loads((got / "env.json").read_text())["torch"] == torch.__version__
    if tarball:
        for method in ("backprop", "petra", "delayed", "dsp"):
            assert json.loads((got / "cifar10" / method / "metrics.json").read_text())["images_per_s"] > 0


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
    assert [r[0] for r in rows] == FIRST_CONTACT_PARTS
    assert all(r[1] == "skipped" for r in rows) and "budget is spent" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first_contact.tar.gz", "status.tsv"]


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
