"""Device profiles: what one device does per stage and minibatch, with where the numbers came from.

A profile is, for one (model, method, batch, precision) on one device: per stage, the device
seconds of its forward, rebuild (reconstruction or recomputation) and backward per minibatch and
of one optimizer step; the bytes it keeps per minibatch in flight; its weights, gradients and
optimizer state; and the bytes of its forward and backward messages. ``provenance`` says where it
came from (measured here with a command at a revision, or read from ``results/gpu/...``).

Profiles are JSON, written atomically. A profile asked for another model than it was made for is
refused in one line (:func:`check_profile`). Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .cluster import PlanError

PHASES = ("forward", "rebuild", "backward", "step")
BYTE_FIELDS = (
    "weight_bytes", "grad_bytes", "optimizer_bytes", "kept_bytes", "forward_message_bytes",
    "backward_message_bytes", "work_bytes", "shared_bytes", "joint_bytes",
)  # fmt: skip
FORMAT = 1
STEMS = {"cifar": (32, 10), "imagenet": (224, 1000)}  # a profiled model's stem: image size, classes


def revision() -> str:
    """The code revision a profile is measured at (``runio.git_revision``: HEAD, ``-dirty`` if a
    tracked file other than a record, the planner's own results or the DVC lock differs from it),
    ``unknown`` outside a checkout. A ``dvc repro`` deletes a stage's outputs and rewrites the lock
    before the stage runs: neither is code."""
    from ..run.runio import git_revision

    return git_revision(outputs=("results/plan", "dvc.lock")) or "unknown"


@dataclass(frozen=True)
class StageProfile:
    """One stage: seconds per minibatch of each phase (``step_s``: one optimizer step) and bytes.

    ``host_s`` is the engine's own work per tick outside the phases (dispatch, packing and posting
    messages, the tick's bookkeeping): on a fast device or with tiny stages it sets the pace, so
    a profile that measured it lets the planner charge it; a device profile leaves it 0."""

    forward_s: float
    rebuild_s: float
    backward_s: float
    step_s: float
    weight_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    kept_bytes: int = 0  # kept per minibatch in flight, besides stashed weights
    forward_message_bytes: int = 0  # sent up to the next stage per minibatch (0 at the head)
    backward_message_bytes: int = 0  # sent down to the previous stage per minibatch (0 at stage 0)
    work_bytes: int = 0  # held only while the stage computes (its input, output, a graph it builds)
    shared_bytes: int = 0  # counted twice above at steady state (one tensor both buffered and in flight)
    joint_bytes: int = 0  # of kept_bytes, what the previous stage's kept graph also holds when on one device
    host_s: float = 0.0  # host seconds per tick the stage acts in, outside its phases (0: the device sets the pace)

    def phase(self, name: str) -> float:
        return getattr(self, f"{name}_s")


@dataclass(frozen=True)
class DeviceProfile:
    """A model's stages on one device, for one method, batch and precision."""

    arch: str
    method: str
    batch: int
    stages: tuple[StageProfile, ...]
    device: str = "cpu"
    precision: str = "fp32"
    width: int = 64
    stem: str = "cifar"
    image_size: int = 32
    k: int = 1
    provenance: dict = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def phase_seconds(self) -> dict[str, list[float]]:
        """``{phase: [seconds per stage]}`` (the form an emulation is configured with)."""
        return {p: [s.phase(p) for s in self.stages] for p in PHASES}

    def scaled(self, factor: float) -> DeviceProfile:
        """The same profile with every phase time times ``factor`` (bytes unchanged)."""
        stages = tuple(
            StageProfile(**{**asdict(s), **{f"{p}_s": s.phase(p) * factor for p in PHASES}}) for s in self.stages
        )
        return DeviceProfile(**{**self._fields(), "stages": stages})

    def _fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> dict:
        out = asdict(self)
        out["format"] = FORMAT
        return out

    @classmethod
    def from_json(cls, data: dict, where: str = "profile") -> DeviceProfile:
        if not isinstance(data, dict) or data.get("format") != FORMAT or not data.get("stages"):
            raise PlanError(f"{where}: not a petra plan profile (format {FORMAT} with stages)")
        known = {f.name for f in fields(StageProfile)}
        try:
            stages = tuple(StageProfile(**{k: v for k, v in s.items() if k in known}) for s in data["stages"])
            rest = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "stages"}
            return cls(stages=stages, **rest)
        except (TypeError, AttributeError) as err:
            raise PlanError(f"{where}: a stage or field is malformed ({err})") from None


def save_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON, atomically (a temporary file renamed over the old one)."""
    from ..run.runio import atomic_write

    text = json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n"
    atomic_write(Path(path), lambda f: f.write(text.encode()))
    return Path(path)


def load_profile(path: str | Path) -> DeviceProfile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"profile {path}: no such file") from None
    except json.JSONDecodeError as err:
        raise PlanError(f"profile {path}: not JSON ({err.msg} at line {err.lineno})") from None
    return DeviceProfile.from_json(data, str(path))


def check_profile(profile: DeviceProfile, *, arch: str, width: int | None = None, stages: int | None = None) -> None:
    """Refuse, in one line, a profile made for another model than the one asked for."""
    source = profile.provenance.get("source", "profile")
    if profile.arch != arch:
        raise PlanError(f"profile ({source}) is of model {profile.arch!r}, not {arch!r}: profile {arch} first")
    if width is not None and profile.width != width:
        raise PlanError(f"profile ({source}) is of {arch} width {profile.width}, not width {width}")
    if stages is not None and profile.num_stages != stages:
        raise PlanError(
            f"profile ({source}) has {profile.num_stages} stages, the plan asks for {stages}; "
            f"allowed: --stages {profile.num_stages} (a split puts several stages on one device: --devices)"
        )
