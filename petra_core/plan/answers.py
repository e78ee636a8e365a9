"""The reviewers' questions, answered by the planner from committed profiles: ``petra plan answers``.

For RevNet18 on CIFAR and RevNet50 on ImageNet (the first H200's per-stage phase times,
``results/gpu/nvidia-h200/stage_profile.json``, batch 64 per pipeline) on each cluster card: per
method and device count, the fastest pipeline × replicas and its time per minibatch and per epoch,
speedup, bubble and peak memory per device; the fewest devices that hold the model at a batch of
256 (one pipeline, sized on the meta device); the largest RevNet per method. Every row carries its
provenance (profile, card, code revision). GPipe and 1F1B run backprop's stages with backprop's
phases (``methods/registry.py``: the same storage), so their times are backprop's profile, said in
the row. A method the profile has no row for is left out and named in ``missing``.

The record is the ``plan`` study's (``workflow/studies/plan.yaml``): ``petra_core/report/plan.py``
renders its table and figure.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from .cluster import PlanError, load_cluster
from .formulas import PIPEDREAM_FORMULA, PIPEDREAM_SOURCE, memory_terms
from .profile import STEMS, revision
from .profiling import from_stage_profile
from .search import best_split, largest_revnet, min_devices, scan_devices, sized_profile, stage_costs
from .simulate import predict

CONFIGS = (("revnet18", "cifar", 50_000), ("revnet50", "imagenet", 1_281_167))  # arch, stem, images an epoch
CLUSTERS = ("h100-sxm-node", "h200-sxm-node", "8x1-100gbe")
METHODS = ("backprop", "delayed", "dsp", "petra", "gpipe", "1f1b")
FLUSHED = ("gpipe", "1f1b")


def card_file(card: str) -> str:
    """Where a cluster card named on the command line is (a shipped card's name, or a YAML path)."""
    return card if card.endswith((".yaml", ".yml")) else f"petra_core/plan/clusters/{card}.yaml"


def method_profile(path: str | Path, arch: str, method: str, settings: str):
    """The profile of ``method`` (GPipe and 1F1B: backprop's phases, under their own method)."""
    source = "backprop" if method in FLUSHED else method
    p = from_stage_profile(path, arch=arch, method=source, settings=settings)
    if source != method:
        p = replace(
            p, method=method, provenance={**p.provenance, "phases_of": "backprop (the same stages and storage)"}
        )
    return p


def layout_rows(p, method: str, k: int, card, per_epoch: int, profile_path, settings: str) -> list[dict]:
    """Per device count G on ``card``: ``layout`` best (the most samples/s among P pipeline devices ×
    R replicas = G) and pipeline (one pipeline split over G devices, R = 1: speedup vs J)."""
    costs = stage_costs(p, k)
    best = scan_devices(p, method, card.devices, k=k, cluster=card)
    piped = [
        predict(
            p,
            method,
            placement=best_split(costs, g),
            k=k,
            cluster=card,
            one_device_seconds=best[0].seconds_per_minibatch,
        )
        for g in range(1, min(card.devices, p.num_stages) + 1)
    ]
    source = f"{profile_path} ({settings}, phases of {p.provenance.get('phases_of', method)})"
    return [
        dict(
            arch=p.arch, stem=p.stem, cluster=card.name, method=method, k=k, layout=layout, devices=pr.devices,
            replicas=pr.replicas, split=pr.split, batch=p.batch, seconds_per_minibatch=pr.seconds_per_minibatch,
            seconds_per_epoch=pr.seconds_per_minibatch * per_epoch / pr.replicas, samples_per_s=pr.samples_per_s,
            speedup=pr.speedup, bubble_fraction=pr.bubble_fraction, peak_bytes=max(pr.peak_bytes),
            memory_bytes=card.memory_bytes, fits=pr.fits, profile=source,
        )
        for layout, predictions in (("best", best), ("pipeline", piped))
        for pr in predictions
    ]  # fmt: skip


def fewest_devices(arch: str, stem: str, method: str, k: int, card, batch: int, width: int = 64) -> dict:
    """The fewest of ``card``'s devices (as many as needed) that hold one pipeline at a minibatch of
    ``batch`` (GPipe, 1F1B: k microbatches of batch / k), sized on the meta device."""
    micro = batch // k
    sized = sized_profile(arch, width, method, batch=micro, stem=stem)
    try:
        found = min_devices(sized, method, card.memory_bytes, k=k)
    except PlanError as err:
        found, why = None, str(err)
    else:
        why = None if found else "no split of one pipeline fits"
    return dict(arch=arch, cluster=card.name, method=method, batch=batch, microbatch=micro, k=k,
                devices=found[0] if found else None, why=why)  # fmt: skip


def answers(
    profile_path: str | Path, *, clusters=CLUSTERS, methods=METHODS, settings: str = "training", k_flushed: int = 4,
    batch_for_min: int = 256,
) -> dict:  # fmt: skip
    """``rows`` (one per model, cluster, method, layout and device count), ``fewest`` (devices at
    ``batch_for_min``), ``largest`` (per model family, cluster and method), ``formulas`` (per model,
    method and stage: the closed forms' memory), ``missing``, ``provenance``."""
    rows, fewest, largest, missing, formulas = [], [], [], [], []
    cards = [load_cluster(c) for c in clusters]
    for arch, stem, images in CONFIGS:
        for card in cards:
            for method in methods:
                k = k_flushed if method in FLUSHED else 1
                fewest.append(fewest_devices(arch, stem, method, k, card, batch_for_min))
                try:
                    p = method_profile(profile_path, arch, method, settings)
                except PlanError:
                    gap = dict(arch=arch, method=method, why=f"no {settings} row in {profile_path}")
                    missing += [gap] if gap not in missing else []
                    continue
                rows += layout_rows(p, method, k, card, math.ceil(images / p.batch), profile_path, settings)
        for card in cards:
            for method in [m for m in methods if m not in FLUSHED]:
                big = largest_revnet(card, method, batch=64, stem=stem)
                largest.append(dict(stem=stem, cluster=card.name, method=method, batch=64, **(big or {})))
        shape = method_profile(profile_path, arch, "backprop", settings)  # the profile's width and batch
        image_size, classes = STEMS[stem]
        formulas += memory_terms(arch, width=shape.width, stem=stem, batch=shape.batch, num_classes=classes,
                                 image_size=image_size)  # fmt: skip
    return dict(
        rows=rows, fewest=fewest, largest=largest, formulas=formulas, missing=missing,
        provenance=dict(profile=str(profile_path), settings=settings, clusters=list(clusters), revision=revision(),
                        cards={c.name: dict(card=card_file(arg), source=c.source) for arg, c in zip(clusters, cards)},
                        pipedream=dict(formula=PIPEDREAM_FORMULA, source=PIPEDREAM_SOURCE),
                        epoch="time per minibatch at steady state x minibatches an epoch / replicas (fill ignored)"),
    )  # fmt: skip


def measure(settings: dict | None = None) -> dict:
    """The record ``petra plan answers`` writes, at ``settings`` (keywords of :func:`answers`; the
    default profile when none): the entry point that tests load the measurement's modules through."""
    settings = dict(settings or {})
    return answers(settings.pop("profile", "results/gpu/nvidia-h200/stage_profile.json"), **settings)
