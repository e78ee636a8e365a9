"""A device profile measured on an accelerator: ``petra plan profile --device cuda``.

The method's pipeline is built on the device (one process, every stage on it) and, after the
pipeline has filled, timed by :func:`~petra_core.plan.clock.stage_phase_times`: a host pass, then a
device pass whose CUDA events time each phase's own kernels (the launches hidden behind a sleep
on the stream), so a phase's time is the device's, not the host's. Bytes come from the accounting
on the meta device (``memory.py``): on a GPU the allocator's peaks are the check, not a walk of
what each policy holds. On a CPU the same code runs with ``perf_counter`` (how it is tested here).
"""

from __future__ import annotations

import platform

from .memory import model_sizes, stage_bytes
from .profile import BYTE_FIELDS, DeviceProfile, StageProfile


def pipeline_phase_seconds(
    arch: str, method: str, *, batch: int, width: int, stem: str, k: int, minibatches: int, device: str
) -> list[dict[str, float]]:
    """Per stage, ``{phase: seconds}``: forward, rebuild, backward per minibatch, step per step."""
    import torch

    from .. import Pipeline, build_model
    from ..engine import LocalWorld, PipelineSpec
    from ..methods import get_method
    from .clock import stage_phase_times
    from .profile import STEMS

    image_size, classes = STEMS[stem]
    dev = torch.device(device)
    torch.manual_seed(0)
    model = build_model(arch, num_classes=classes, stem=stem, width=width)
    x = torch.randn(batch, 3, image_size, image_size, device=dev)
    y = torch.randint(0, classes, (batch,), device=dev)
    m = get_method(method)
    J = len(model)
    if m.schedule.fixed_weights_in_flight:  # whole groups of k: a flush each
        groups = max(1, -(-minibatches // k))
        period = m.schedule(J, k, k=k).num_ticks
        fill, ticks, timed, total = period, groups * period, groups * k, k * (2 * groups + 1)
    else:  # past the fill, one minibatch enters a tick
        fill, ticks, timed = 2 * (J - 1), minibatches, minibatches
        total = fill + 2 * minibatches + 1
    pipe = Pipeline.build(
        PipelineSpec(
            model=model, method=method, world=LocalWorld(devices=[dev] if dev.type == "cuda" else None),
            num_batches=total, get_batch=lambda mb: (x, y), batch_size=batch, k=k,
        )
    )  # fmt: skip
    pipe.run(fill)
    times = stage_phase_times(pipe, ticks, timed)["stage_device_ms"]
    return [
        {
            "forward": s.get("forward", 0.0) / 1e3,
            "rebuild": s.get("rebuild", 0.0) / 1e3,
            "backward": s.get("backward", 0.0) / 1e3,
            "step": s.get("step", 0.0) * k / 1e3,  # per minibatch there, per step here
        }
        for s in times
    ]


def measure_device_profile(
    arch: str, method: str, *, batch: int, width: int, stem: str, k: int, minibatches: int, device: str, command: str
) -> DeviceProfile:
    """A profile of ``method`` timed on ``device`` (its phases) with the accounting's bytes."""
    import torch

    from .profile import STEMS, revision

    image_size, classes = STEMS[stem]
    phases = pipeline_phase_seconds(
        arch, method, batch=batch, width=width, stem=stem, k=k, minibatches=minibatches, device=device
    )
    sizes = stage_bytes(model_sizes(arch, width, stem, classes, batch, image_size), method, batch=batch)
    stages = tuple(
        StageProfile(**{f"{p}_s": t for p, t in ph.items()}, **{key: b[key] for key in BYTE_FIELDS})
        for ph, b in zip(phases, sizes, strict=True)
    )
    name = (
        torch.cuda.get_device_name(device) if device.startswith("cuda") else f"cpu ({platform.processor() or 'host'})"
    )
    return DeviceProfile(
        arch=arch, method=method, batch=batch, stages=stages, device=name, precision="fp32", width=width, stem=stem,
        image_size=image_size, k=k,
        provenance=dict(source="measured", command=command, revision=revision(), torch=torch.__version__,
                        times="device pass of petra_core/plan/clock.py: CUDA events, launches hidden by a sleep",
                        bytes="accounting on the meta device (petra_core/plan/memory.py)"),
    )  # fmt: skip
