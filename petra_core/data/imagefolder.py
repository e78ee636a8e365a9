"""Decode an image-folder tree, or a tarball of one, into uint8 arrays.

Layout: ``ROOT/<split>/<class>/<file>`` with split in ``splits`` (default train, test).
Classes are the sorted names of the class directories, so labels agree with
torchvision's ``ImageFolder`` (and, for CIFAR-10, with torchvision's ``CIFAR10``).
Examples are ordered by (class, file name) in both readers, so a folder and a tarball of
it give identical arrays.  The tarball is read sequentially in memory, never extracted:
for the real CIFAR-10 tarball (60,000 JPEGs) this takes about 8 s on one core.
"""
from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from .arrays import ArrayData, ArraySplit
from .errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")

# entries[split][class] -> list of (file name, HWC uint8 array)
_Entries = dict[str, dict[str, list[tuple[str, np.ndarray]]]]


def is_image_name(name: str) -> bool:
    """Image files by extension; hidden files (e.g. macOS ``._x.jpg``) are skipped."""
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def is_tarball(path: Path) -> bool:
    return path.name.lower().endswith(TAR_SUFFIXES)


def decode_image(data: bytes, where: str, image_size: int | None) -> np.ndarray:
    """Decode one encoded image to H×W×3 uint8 RGB; DataError if unreadable or wrongly sized."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            arr = np.asarray(im if im.mode == "RGB" else im.convert("RGB"), dtype=np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise DataError(f"{where}: cannot decode image ({e}); expected a readable image file") from None
    if image_size is not None and arr.shape[:2] != (image_size, image_size):
        raise DataError(f"{where}: image is {arr.shape[1]}×{arr.shape[0]}; expected {image_size}×{image_size}")
    return arr


def read_image_folder(root: str | Path, *, name: str, splits: tuple[str, str] = ("train", "test"),
                      image_size: int | None = None) -> ArrayData:
    """Decode ``root/<split>/<class>/*`` into an :class:`ArrayData`."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; expected an image-folder root with "
                        f"{'/ and '.join(splits)}/ subdirectories")
    entries: _Entries = {}
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise DataError(f"{split_dir}: no such directory; expected {split}/<class>/<image> under {root}")
        classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        entries[split] = {}
        for cls in classes:
            files = sorted(p for p in (split_dir / cls).iterdir() if p.is_file() and is_image_name(p.name))
            entries[split][cls] = [(f.name, decode_image(f.read_bytes(), str(f), image_size)) for f in files]
    return _assemble(entries, name=name, where=str(root), source={"kind": "image-folder", "path": str(root)})


def read_image_tar(path: str | Path, *, name: str, splits: tuple[str, str] = ("train", "test"),
                   image_size: int | None = None) -> ArrayData:
    """Decode a ``.tar.gz``/``.tgz``/``.tar`` of an image-folder tree without extracting it.

    The tree may sit at the archive root or inside one top-level directory.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; expected a .tar.gz of {'/ and '.join(splits)}/<class>/<image>")
    entries: _Entries = {split: {} for split in splits}
    wrapper: set[str] = set()
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                parts = PurePosixPath(member.name).parts  # "./train/x" -> ("train", "x")
                if len(parts) >= 2 and parts[0] not in splits and parts[1] in splits:
                    wrapper.add(parts[0])
                    parts = parts[1:]
                if not parts or parts[0] not in splits or any(p.startswith(".") for p in parts[1:]):
                    continue
                if member.isdir() and len(parts) == 2:
                    entries[parts[0]].setdefault(parts[1], [])
                elif member.isfile() and len(parts) == 3 and is_image_name(parts[2]):
                    data = tf.extractfile(member).read()
                    arr = decode_image(data, f"{path}:{member.name}", image_size)
                    entries[parts[0]].setdefault(parts[1], []).append((parts[2], arr))
            # Drain the compressed stream so a cut-off gzip trailer (CRC) is detected too.
            while tf.fileobj.read(1 << 20):
                pass
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise DataError(f"{path}: truncated or corrupted archive ({type(e).__name__}: {e}); "
                        f"expected a complete .tar.gz of an image-folder tree") from None
    if len(wrapper) > 1:
        raise DataError(f"{path}: split directories under several top-level folders {sorted(wrapper)}; "
                        f"expected one tree")
    for split in splits:
        for files in entries[split].values():
            files.sort(key=lambda item: item[0])
    return _assemble(entries, name=name, where=str(path), source={"kind": "image-tar", "path": str(path)})


def _assemble(entries: _Entries, *, name: str, where: str, source: dict) -> ArrayData:
    """Check the class lists, assign labels in sorted class order and stack the arrays."""
    train_split, test_split = list(entries)
    train_classes, test_classes = sorted(entries[train_split]), sorted(entries[test_split])
    if not train_classes:
        raise DataError(f"{where}: no class directories in {train_split}/; expected {train_split}/<class>/<image>")
    if train_classes != test_classes:
        only_train = sorted(set(train_classes) - set(test_classes))
        only_test = sorted(set(test_classes) - set(train_classes))
        raise DataError(f"{where}: inconsistent class lists between {train_split}/ and {test_split}/ "
                        f"(only in {train_split}: {only_train}, only in {test_split}: {only_test}); "
                        f"expected the same class directories")
    splits = []
    for split in (train_split, test_split):
        images, labels = [], []
        for label, cls in enumerate(train_classes):
            for _fname, arr in entries[split][cls]:
                images.append(arr)
                labels.append(label)
        if not images:
            raise DataError(f"{where}: no images in {split}/; expected {split}/<class>/*"
                            f"{{{','.join(IMAGE_EXTENSIONS)}}}")
        shapes = {a.shape for a in images}
        if len(shapes) > 1:
            raise DataError(f"{where}: {split}/ images have several sizes {sorted(shapes)}; expected one size")
        splits.append(ArraySplit(np.stack(images), np.asarray(labels, dtype=np.int64)))
    return ArrayData(name, splits[0], splits[1], num_classes=len(train_classes),
                     class_names=tuple(train_classes), source=source)
