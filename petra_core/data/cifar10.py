"""CIFAR-10 from any of its three forms, always as the same uint8 arrays.

* an image-folder tree ``ROOT/train/<class>/*.jpg`` + ``ROOT/test/<class>/*.jpg``;
* a ``.tar.gz`` of such a tree (e.g. ``../shared/data/cifar10-jpeg.tar.gz``), read in memory;
* torchvision's release (``ROOT/cifar-10-batches-py``, or the original
  ``cifar-10-python.tar.gz``, or ``download=True`` where there is internet).

Sorted class names equal torchvision's label order, so all three agree on labels.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .arrays import ArrayData, ArraySplit
from .errors import DataError
from .imagefolder import is_tarball, read_image_folder, read_image_tar

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
IMAGE_SIZE = 32
TORCHVISION_DIR = "cifar-10-batches-py"
TORCHVISION_ARCHIVE = "cifar-10-python.tar.gz"


def load_cifar10(source: str | Path, *, download: bool = False) -> ArrayData:
    """Read CIFAR-10 from a folder tree, a tarball of one, or torchvision's release (auto-detected)."""
    source = Path(source)
    if not source.exists() and not download:
        raise DataError(f"{source}: no such file or directory; expected a CIFAR-10 image folder, "
                        f".tar.gz of one, or torchvision release")
    if source.name == TORCHVISION_ARCHIVE and source.is_file():
        # torchvision skips the download when the archive is present with the right md5.
        return read_torchvision_cifar10(source.parent, download=True)
    if source.name == TORCHVISION_DIR and source.is_dir():
        return read_torchvision_cifar10(source.parent, download=download)
    if source.is_file() and is_tarball(source):
        return read_image_tar(source, name="cifar10", image_size=IMAGE_SIZE)
    if (source / "train").is_dir() or (source / "test").is_dir():
        return read_image_folder(source, name="cifar10", image_size=IMAGE_SIZE)
    if download or (source / TORCHVISION_DIR).is_dir():
        return read_torchvision_cifar10(source, download=download)
    raise DataError(f"{source}: no CIFAR-10 found; expected train/ + test/ image folders, a .tar.gz of them, "
                    f"or torchvision's {TORCHVISION_DIR}/ (pass download=True to fetch it)")


def read_torchvision_cifar10(root: str | Path, *, download: bool = False) -> ArrayData:
    """Read (and with ``download=True`` fetch) ``torchvision.datasets.CIFAR10`` under ``root``."""
    from torchvision.datasets import CIFAR10

    root = Path(root)
    if not download and not (root / TORCHVISION_DIR).is_dir():
        raise DataError(f"{root}: no {TORCHVISION_DIR}/ here; expected torchvision's CIFAR-10 release "
                        f"(pass download=True to fetch it)")
    try:
        train = CIFAR10(str(root), train=True, download=download)
        test = CIFAR10(str(root), train=False, download=False)
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{root}: torchvision CIFAR-10 unavailable or corrupted ({msg}); expected "
                        f"{TORCHVISION_DIR}/ with its batches (or download=True with internet)") from None
    if tuple(train.classes) != CLASSES:
        raise DataError(f"{root}: torchvision classes {train.classes}; expected {list(CLASSES)}")
    splits = [ArraySplit(np.ascontiguousarray(ds.data, dtype=np.uint8), np.asarray(ds.targets, dtype=np.int64))
              for ds in (train, test)]
    return ArrayData("cifar10", splits[0], splits[1], num_classes=len(CLASSES), class_names=CLASSES,
                     source={"kind": "torchvision-cifar10", "path": str(root)})
