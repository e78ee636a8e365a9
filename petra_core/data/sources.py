"""The datasets petra can read, each declared once: name -> :class:`DataSource`.

A source declares its reader, the keyword parameters the reader takes, whether it generates its
data (no source path) or fetches it (the source path is optional), its kind (``images``: the model
stem its images fit and their normalisation; ``text``: a character corpus, ``text.py``, with
neither). Nothing is read from the reader's signature: a parameter it does not declare is refused
in one line before anything is read. :func:`register_source` adds a dataset.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .arrays import ArrayData
from .augment import CIFAR10_NORM, IMAGENET_NORM, SYNTHETIC_NORM, Normalization
from .cifar10 import load_cifar10
from .errors import DataError
from .imagenet import FolderData, load_imagenet
from .imagenet32 import load_imagenet32
from .synthetic import make_synthetic
from .text import TextData, read_botchan, read_shakespeare

KINDS = ("images", "text")


@dataclass(frozen=True)
class DataSource:
    """A dataset: ``reader(source, **params)``, or ``reader(**params)`` when it is ``generated``."""

    name: str
    reader: Callable[..., ArrayData | FolderData | TextData]
    stem: str | None  # images: the model stem they fit, "cifar" (32×32) or "imagenet"; text: None
    normalization: Normalization | None  # images only
    params: tuple[str, ...] = ()  # the reader's keyword parameters
    generated: bool = False  # makes its data: takes no source
    kind: str = "images"  # or "text": token ids (TextData), read by the text stream
    fetches: bool = False  # without a source, the reader downloads it (a source is still accepted)

    def load(self, source: str | Path | None = None, **params) -> ArrayData | FolderData | TextData:
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise DataError(f"{self.name}: unknown parameter {unknown[0]!r}; "
                            f"allowed: {', '.join(self.params) if self.params else 'none'}")
        if self.generated:
            if source is not None:
                raise DataError(f"{self.name}: source={source!r}; expected None (the data is generated)")
            return self.reader(**params)
        if source is None and not self.fetches:
            raise DataError(f"{self.name}: no source given; expected a path to the raw {self.name} data")
        return self.reader(source, **params)


SOURCES: dict[str, DataSource] = {}
DATASETS = SOURCES.keys()  # the names, live: a source registered later is a dataset too


def register_source(source: DataSource) -> DataSource:
    """Make ``source`` readable by its name (a config's ``dataset``); returns it."""
    if source.kind not in KINDS:
        raise DataError(f"data source {source.name!r}: kind={source.kind!r}; expected {' or '.join(KINDS)}")
    if source.kind == "images" and source.stem not in ("cifar", "imagenet"):
        raise DataError(f"data source {source.name!r}: stem={source.stem!r}; expected cifar or imagenet")
    if source.kind == "text" and (source.stem is not None or source.normalization is not None):
        raise DataError(f"data source {source.name!r}: stem={source.stem!r} or a normalization; expected "
                        f"neither for text")
    if SOURCES.get(source.name, source) != source:
        raise DataError(f"data source name {source.name!r} is taken")
    SOURCES[source.name] = source
    return source


for _source in (
    DataSource("cifar10", load_cifar10, "cifar", CIFAR10_NORM, params=("download",)),
    DataSource("imagenet32", load_imagenet32, "cifar", IMAGENET_NORM),
    DataSource("imagenet", load_imagenet, "imagenet", IMAGENET_NORM),
    DataSource("synthetic", make_synthetic, "cifar", SYNTHETIC_NORM, generated=True,
               params=("num_classes", "n_train", "n_test", "image_size", "seed", "max_shift", "noise")),
    DataSource("shakespeare", read_shakespeare, None, None, kind="text", fetches=True),
    DataSource("botchan", read_botchan, None, None, kind="text", fetches=True),
):
    register_source(_source)


def get_source(name: str) -> DataSource:
    if name not in SOURCES:
        raise DataError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    return SOURCES[name]


def load_source(name: str, source: str | Path | None = None, **params) -> ArrayData | FolderData:
    """Read dataset ``name`` from ``source`` (a generated one takes no source, only parameters)."""
    return get_source(name).load(source, **params)
