"""Where device profiles come from: measured on this machine, or read from committed GPU results.

* :func:`measure_profile` (``petra plan profile``; on a GPU: ``device_profile.py``): on a CPU, runs
  the method in the engine's simulator for a few minibatches on random data under the
  accounting's :class:`Recorder`, which times every
  stage's phases (forward, rebuild, backward, step) and records the bytes each stage keeps per
  minibatch and sends; the times are the medians over the second half of the minibatches, after
  the pipeline filled (``table1.steady_phases``, the rule of Table 1's time column). Weights,
  gradients and optimizer state come from the model's parameters, a stage's working set from the
  accounting on the meta device. On this CPU, the host is the device.
* :func:`from_stage_profile`: a profile from ``results/gpu/<device>/stage_profile.json`` (the first
  GPU's probe): per stage the synced phase times (``*_host_s``: a synchronize before and after each
  phase, so they bound the phase's device time from above; that file's README says its kernel sums
  double-count, so they are not used), and the bytes from the accounting on the meta device.
"""

from __future__ import annotations

import json
from pathlib import Path

from .cluster import PlanError
from .memory import model_sizes, stage_bytes
from .profile import BYTE_FIELDS, STEMS, DeviceProfile, StageProfile, revision


def _stem(stem: str) -> tuple[int, int]:
    if stem not in STEMS:
        raise PlanError(f"unknown stem {stem!r}; allowed: {', '.join(STEMS)}")
    return STEMS[stem]


def measure_profile(
    arch: str, method: str, *, batch: int, width: int = 64, stem: str = "cifar", k: int = 1, minibatches: int = 24,
    device: str = "cpu",
) -> DeviceProfile:  # fmt: skip
    """Time each stage's phases of ``method`` on ``device`` and record its bytes (a GPU:
    :func:`~petra_core.plan.device_profile.measure_device_profile`)."""
    import platform

    from ..accounting.table1 import run_method, steady_phases

    image_size, classes = _stem(stem)
    command = (
        f"petra plan profile --model {arch} --method {method} --batch {batch} --width {width} --stem {stem} "
        f"--k {k} --minibatches {minibatches} --device {device}"
    )
    if device != "cpu":
        if not device.startswith("cuda"):
            raise PlanError(f"unknown device {device!r}; allowed: cpu, cuda, cuda:N")
        from .device_profile import measure_device_profile

        return measure_device_profile(arch, method, batch=batch, width=width, stem=stem, k=k,
                                      minibatches=minibatches, device=device, command=command)  # fmt: skip
    rec = run_method(
        arch, method, stem=stem, image_size=image_size, batch=batch, num_batches=minibatches, width=width,
        num_classes=classes, k=k, flops_minibatches=(), walk_held=True,
    )  # fmt: skip
    frames = rec.frames()
    phases, messages, kept = frames["phases"], frames["messages"], frames["kept"]
    secs = steady_phases(phases, minibatches).pivot_table(
        index="stage", columns="phase", values="seconds", aggfunc="median"
    )
    model = rec.sim.model
    J = len(model)
    sizes = stage_bytes(model_sizes(arch, width, stem, classes, batch, image_size), method, batch=batch)
    per_mb = (
        kept[(kept.in_flight == 1) & (kept.buffer != "weight_stash")].groupby(["stage", "buffer"]).held_bytes.first()
    )
    per_mb = per_mb.groupby("stage").sum()
    sent = messages.groupby(["stage", "direction"]).payload_bytes.mean()
    labels = messages.groupby(["stage", "direction"]).labels_bytes.mean()
    stages = []
    for j, stage in enumerate(model):
        params = 4 * sum(p.numel() for p in stage.parameters())

        def phase(name, j=j):
            return float(secs.loc[j, name]) if name in secs.columns and j in secs.index else 0.0

        def msg(direction, j=j):
            key = (j, direction)
            return int(sent.get(key, 0) + labels.get(key, 0))

        stages.append(
            StageProfile(
                forward_s=phase("forward"), rebuild_s=phase("rebuild"), backward_s=phase("backward"),
                step_s=phase("step"), weight_bytes=params, grad_bytes=params, optimizer_bytes=params,
                kept_bytes=int(per_mb.get(j, 0)) if j < J - 1 else 0,
                forward_message_bytes=msg("forward"), backward_message_bytes=msg("backward"),
                work_bytes=sizes[j]["work_bytes"],
            )
        )  # fmt: skip
    return DeviceProfile(
        arch=arch, method=method, batch=batch, stages=tuple(stages), device=f"cpu ({platform.processor() or 'host'})",
        precision="fp32", width=width, stem=stem, image_size=image_size, k=k,
        provenance=dict(source="measured", command=command, revision=revision(),
                        times="medians over the second half of the minibatches, perf_counter around each phase"),
    )  # fmt: skip


def from_stage_profile(
    path: str | Path, *, arch: str, method: str, settings: str = "training", source: str | None = None
) -> DeviceProfile:
    """The row (``arch``, ``method``, ``settings``) of a ``stage_profile.json`` as a profile."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"stage profile {path}: no such file") from None
    rows = [r for r in data.get("rows", []) if (r["arch"], r["method"], r["settings"]) == (arch, method, settings)]
    if not rows:
        have = sorted({(r["arch"], r["method"], r["settings"]) for r in data.get("rows", [])})
        raise PlanError(
            f"stage profile {path} has no row for {arch} {method} {settings}; allowed: "
            + ", ".join(" ".join(h) for h in have)
        )
    row = rows[0]
    image_size, classes = _stem(row["stem"])
    sizes = stage_bytes(model_sizes(arch, row["width"], row["stem"], classes, row["batch"], image_size), method,
                        batch=row["batch"])  # fmt: skip
    stages = tuple(
        StageProfile(
            forward_s=s["forward_host_s"], rebuild_s=s["rebuild_host_s"], backward_s=s["backward_host_s"],
            step_s=s["step_host_s"],
            **{key: b[key] for key in BYTE_FIELDS},
        )
        for s, b in zip(row["per_stage"], sizes, strict=True)
    )  # fmt: skip
    return DeviceProfile(
        arch=arch, method=method, batch=row["batch"], stages=stages, device=data.get("device", "?"),
        precision="bf16" if settings == "bf16" else "fp32", width=row["width"], stem=row["stem"],
        image_size=image_size,
        provenance=dict(source=source or str(path), settings=settings,
                        times="synced per-phase times (*_host_s): upper bounds of device time",
                        bytes="accounting on the meta device (petra_core/plan/memory.py)",
                        wall_s_per_minibatch=row["wall_s_per_minibatch"]),
    )  # fmt: skip
