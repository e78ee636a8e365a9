"""The planner's searches: the best split, the fewest devices, the largest RevNet that fits.

* :func:`best_split`: the contiguous split of J stages over G devices that minimises the slowest
  device's time per minibatch (a stage's forward + rebuild + backward + its step's share), among
  the splits whose every device fits a memory cap: an exact dynamic programme over prefix sums,
  O(J² G) (without a cap, the engine's own ``partition_contiguous``, the ``balanced`` placement).
* :func:`min_devices`: the fewest devices (one pipeline, split as :func:`best_split` says) on which
  a (model, method, batch) fits a memory cap.
* :func:`largest_revnet`: per method, the largest RevNet of the depth × width family whose best
  memory split fits a cluster's devices, sized on the meta device (no compute).
* :func:`scan_devices`: for G = 1..N devices, the configuration with the most samples per second
  among P × R = G (P pipeline devices, R replicas) and its predicted time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .cluster import Cluster, PlanError
from .memory import device_peak_bytes, stage_peak_bytes
from .profile import BYTE_FIELDS, DeviceProfile, StageProfile
from .simulate import Prediction, predict

DEPTHS = ("revnet18", "revnet34", "revnet50")
WIDTHS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def stage_costs(profile: DeviceProfile, k: int = 1) -> list[float]:
    """Seconds per minibatch each stage keeps its device busy."""
    return [s.forward_s + s.rebuild_s + s.backward_s + s.step_s / k for s in profile.stages]


def best_split(
    costs: Sequence[float], devices: int, memory: Sequence[float] | None = None, cap: float | None = None
) -> list[range] | None:
    """The contiguous split of the stages over ``devices`` devices with the smallest largest cost,
    each device's ``memory`` sum at most ``cap``; None when no split fits."""
    J = len(costs)
    if not 1 <= devices <= J:
        raise PlanError(f"cannot split {J} stages over {devices} devices; allowed: 1 to {J}")
    if cap is None or memory is None:
        from ..engine.placement import partition_contiguous

        return partition_contiguous(costs, devices)
    if max(memory) > cap:
        return None
    cost, mem = [0.0], [0.0]
    for c, m in zip(costs, memory, strict=True):
        cost.append(cost[-1] + c)
        mem.append(mem[-1] + m)
    inf = math.inf
    best = [[inf] * (J + 1) for _ in range(devices + 1)]
    cut = [[0] * (J + 1) for _ in range(devices + 1)]
    best[0][0] = 0.0
    for p in range(1, devices + 1):
        for i in range(p, J - (devices - p) + 1):
            for s in range(i - 1, p - 2, -1):
                if mem[i] - mem[s] > cap:
                    break  # a longer range only holds more
                cand = max(best[p - 1][s], cost[i] - cost[s])
                if cand < best[p][i]:
                    best[p][i], cut[p][i] = cand, s
    if best[devices][J] == inf:
        return None
    ranges, i = [], J
    for p in range(devices, 0, -1):
        ranges.append(range(cut[p][i], i))
        i = cut[p][i]
    return ranges[::-1]


def min_devices(profile: DeviceProfile, method: str, cap: float, *, k: int = 1) -> tuple[int, list[range]] | None:
    """The fewest devices of ``cap`` bytes each that hold the model under ``method`` (one pipeline),
    and the fastest split on them; None when even one stage per device does not fit."""
    peaks = stage_peak_bytes(profile.stages, method, k=k)
    weights = [s.weight_bytes + s.grad_bytes + s.optimizer_bytes for s in profile.stages]
    j = max(range(len(weights)), key=weights.__getitem__)
    if cap < weights[j]:
        raise PlanError(
            f"memory cap {cap / 2**30:.3g} GiB is below stage {j}'s weights, gradients and optimizer state "
            f"({weights[j] / 2**30:.3g} GiB); allowed: a cap of at least that"
        )
    costs = stage_costs(profile, k)
    for g in range(1, profile.num_stages + 1):
        split = best_split(costs, g, peaks, cap)  # what stages hold; then their working set checked too
        if split is not None and max(device_peak_bytes(profile.stages, method, split, k=k)) <= cap:
            return g, split
    return None


def scan_devices(
    profile: DeviceProfile, method: str, max_devices: int, *, k: int = 1, cluster: Cluster | None = None, link=None
) -> list[Prediction]:
    """For each device count G = 1..``max_devices``, the fastest configuration in samples per second
    among P × R = G (a pipeline of P <= J devices, split as :func:`best_split` says, times R
    replicas); ``cluster``: its nodes repeated as far as needed."""
    J = profile.num_stages
    cluster = cluster.grown(max_devices) if cluster is not None else None
    costs = stage_costs(profile, k)
    splits = {g: best_split(costs, g) for g in range(1, min(J, max_devices) + 1)}
    one = predict(profile, method, placement=splits[1], k=k, cluster=cluster, link=link).seconds_per_minibatch
    out = []
    for g in range(1, max_devices + 1):
        options = [
            predict(profile, method, placement=splits[p], replicas=g // p, k=k, cluster=cluster, link=link,
                    one_device_seconds=one)
            for p in range(1, min(g, J) + 1)
            if g % p == 0
        ]  # fmt: skip
        out.append(max(options, key=lambda pr: pr.samples_per_s))
    return out


def sized_profile(arch: str, width: int, method: str, *, batch: int, stem: str) -> DeviceProfile:
    """A profile with bytes only (no times): the model sized on the meta device."""
    from .memory import model_sizes, stage_bytes
    from .profile import STEMS

    image_size, classes = STEMS[stem]
    rows = stage_bytes(model_sizes(arch, width, stem, classes, batch, image_size), method, batch=batch)
    stages = tuple(StageProfile(0.0, 0.0, 0.0, 0.0, **{key: r[key] for key in BYTE_FIELDS}) for r in rows)
    return DeviceProfile(arch, method, batch, stages, width=width, stem=stem, image_size=image_size,
                         provenance=dict(source="accounting on the meta device"))  # fmt: skip


def largest_revnet(
    cluster: Cluster, method: str, *, batch: int, stem: str = "imagenet", k: int = 1,
    depths: Sequence[str] = DEPTHS, widths: Sequence[int] = WIDTHS,
) -> dict | None:  # fmt: skip
    """The RevNet (depth × width) with the most parameters whose best memory split over the
    cluster's devices fits each device (one pipeline); None when none fits."""
    best = None
    for arch in depths:
        for width in widths:
            p = sized_profile(arch, width, method, batch=batch, stem=stem)
            peaks = stage_peak_bytes(p.stages, method, k=k)
            devices = min(cluster.devices, p.num_stages)
            split = best_split([1.0] * p.num_stages, devices, peaks, cluster.memory_bytes)
            per_device = device_peak_bytes(p.stages, method, split, k=k) if split else [math.inf]
            if max(per_device) > cluster.memory_bytes:
                break  # wider only holds more
            params = sum(s.weight_bytes for s in p.stages) // 4
            if best is None or params > best["params"]:
                best = dict(arch=arch, width=width, params=params, devices=devices, peak_bytes=max(per_device),
                            split=",".join(f"{r.start}-{r.stop - 1}" for r in split))  # fmt: skip
    return best
