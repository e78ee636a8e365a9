"""Name -> source reader: the one place that knows which datasets exist."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from .arrays import ArrayData
from .cifar10 import load_cifar10
from .errors import DataError
from .imagenet import FolderData, load_imagenet
from .imagenet32 import load_imagenet32
from .synthetic import make_synthetic

READERS: dict[str, Callable] = {
    "cifar10": load_cifar10,
    "imagenet32": load_imagenet32,
    "imagenet": load_imagenet,
    "synthetic": make_synthetic,
}
DATASETS = tuple(READERS)
# 32×32 datasets use the CIFAR stem of the models; ImageNet uses the ImageNet stem.
STEMS = {"cifar10": "cifar", "imagenet32": "cifar", "synthetic": "cifar", "imagenet": "imagenet"}


def check_name(name: str) -> str:
    if name not in READERS:
        raise DataError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    return name


def load_source(name: str, source: str | Path | None = None, **params) -> ArrayData | FolderData:
    """Read dataset ``name`` from ``source`` (synthetic takes no source, only parameters)."""
    reader = READERS[check_name(name)]
    allowed = [p for p in inspect.signature(reader).parameters if p not in ("source", "name")]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise DataError(f"{name}: unknown parameter(s) {unknown}; expected some of {allowed}")
    if name == "synthetic":
        if source is not None:
            raise DataError(f"synthetic: source={source!r}; expected None (the data is generated)")
        return reader(**params)
    if source is None:
        raise DataError(f"{name}: no source given; expected a path to the raw {name} data")
    return reader(source, **params)
