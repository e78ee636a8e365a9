"""The single front door: dataset name + where it lives -> train/test streams and facts.

``build_data`` reads a prepared directory if one exists there, otherwise prepares it from
``source`` first (so the slow conversion happens once), or — without ``prepared_dir`` —
reads the source straight into memory.  It picks the paper's normalisation and
augmentation for the dataset and says which model stem fits (``"cifar"`` for 32×32 data,
``"imagenet"`` for ImageNet).  A text corpus (``kind`` ``"text"``) gets windows of ``context``
characters (``text_stream.py``), no stem, normalisation or augmentation; its classes are its
vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .arrays import subset_indices, take_subset
from .augment import Normalization
from .errors import DataError
from .imagenet import FolderData
from .prepare import MANIFEST, describe, load_prepared, prepare
from .sources import SOURCES, get_source, load_source
from .stream import FolderMinibatchStream, MinibatchStream
from .text import TextData
from .text_stream import TextStream


_NOT_DATA_DEFINING = {"download"}  # parameters that do not change the prepared arrays


@dataclass(frozen=True)
class DataBundle:
    """Everything a training run needs to know about its data."""

    name: str
    train: MinibatchStream | FolderMinibatchStream | TextStream
    test: MinibatchStream | FolderMinibatchStream | TextStream
    num_classes: int  # text: the vocabulary's size
    image_size: int | None  # text: None
    stem: str | None  # "cifar" or "imagenet": which model stem fits the images; text: None
    manifest: dict
    class_names: tuple[str, ...] | None
    normalization: Normalization | None  # text: None
    subset: int | None = None
    kind: str = "images"  # or "text"
    context: int | None = None  # text: characters per window


def _load(name, source, prepared_dir, verify, params):
    if prepared_dir is None:
        data = load_source(name, source, **params)
        return data, {**describe(data), "params": params}
    prepared_dir = Path(prepared_dir)
    if not (prepared_dir / MANIFEST).is_file():
        if source is None and not (get_source(name).generated or get_source(name).fetches):
            raise DataError(f"{prepared_dir}: not prepared and no source given; expected a source to prepare from")
        try:
            prepare(name, source, prepared_dir, **params)
        except (DataError, OSError):
            if not (prepared_dir / MANIFEST).is_file():  # not a concurrent preparation that won the race
                raise
    data = load_prepared(prepared_dir, verify=verify)
    manifest = data.manifest
    if manifest["dataset"] != name:
        raise DataError(f"{prepared_dir}: holds {manifest['dataset']!r}; expected {name!r}")
    recorded = manifest.get("params", {})
    changed = {k: (recorded.get(k), v) for k, v in params.items()
               if k not in _NOT_DATA_DEFINING and recorded.get(k) != v}
    if changed:
        raise DataError(f"{prepared_dir}: prepared with other parameters (recorded, requested) {changed}; "
                        f"expected the same, or a different prepared_dir")
    return data, manifest


def build_data(name: str, *, source: str | Path | None = None, prepared_dir: str | Path | None = None,
               batch_size: int, seed: int, subset: int | None = None, eval_batch_size: int | None = None,
               drop_last: bool = True, verify: bool = True, num_workers: int = 0, data_seed: int | None = None,
               context: int | None = None, windows_per_epoch: int | None = None, **params) -> DataBundle:
    """Build train/test streams for dataset ``name`` (one of ``SOURCES``: cifar10, imagenet32, imagenet, synthetic,
    and the text corpora shakespeare and botchan).

    ``seed`` drives shuffling and augmentation.  ``subset`` keeps the first N examples of a
    fixed permutation of the training set (the same for every ``seed``).  ``params`` go to
    the source reader (e.g. ``download`` for cifar10, ``n_train`` for synthetic); the
    synthetic generator's own seed is ``data_seed`` (default 0), distinct from ``seed``.
    ``num_workers`` only matters for ImageNet, whose images are decoded per batch. ``context``:
    characters per window, for a text dataset only (required there); ``windows_per_epoch``: its
    training windows per epoch (default: (training characters - 1) // context).
    """
    declared = get_source(name)
    if (context is not None) != (declared.kind == "text"):
        raise DataError(f"context={context!r} for {declared.kind} dataset {name}; expected "
                        f"{'a positive integer (characters per window)' if declared.kind == 'text' else 'None'}")
    if declared.kind != "text" and windows_per_epoch is not None:
        raise DataError(f"windows_per_epoch={windows_per_epoch!r} for images dataset {name}; expected None")
    if declared.kind == "text" and subset is not None:
        raise DataError(f"subset={subset} for text dataset {name}; expected None (subsets are of image datasets)")
    if data_seed is not None:
        if "seed" not in declared.params:
            raise DataError(f"data_seed={data_seed} given for {name}; expected it only for a generated dataset "
                            f"that takes a seed ({', '.join(s.name for s in SOURCES.values() if 'seed' in s.params)})")
        params["seed"] = data_seed
    data, manifest = _load(name, source, prepared_dir, verify, params)
    norm = declared.normalization
    eval_bs = eval_batch_size or batch_size
    if isinstance(data, TextData):
        train = TextStream(data.train, batch_size, context, seed=seed, train=True, windows=windows_per_epoch)
        test = TextStream(data.test, eval_bs, context, seed=seed, train=False)
        return DataBundle(name=name, train=train, test=test, num_classes=data.num_classes, image_size=None,
                          stem=None, manifest=manifest, class_names=None, normalization=None, kind="text",
                          context=context)
    if isinstance(data, FolderData):
        indices = subset_indices(len(data.train), subset) if subset else None
        train = FolderMinibatchStream(data.train, batch_size, seed=seed, train=True, drop_last=drop_last,
                                      norm=norm, num_workers=num_workers, indices=indices)
        test = FolderMinibatchStream(data.test, eval_bs, seed=seed, train=False, norm=norm, num_workers=num_workers)
    else:
        train_split = take_subset(data.train, subset) if subset else data.train
        train = MinibatchStream(train_split, batch_size, seed=seed, train=True, drop_last=drop_last, norm=norm)
        test = MinibatchStream(data.test, eval_bs, seed=seed, train=False, norm=norm)
    return DataBundle(name=name, train=train, test=test, num_classes=data.num_classes, image_size=data.image_size,
                      stem=declared.stem, manifest=manifest, class_names=data.class_names, normalization=norm,
                      subset=subset)
