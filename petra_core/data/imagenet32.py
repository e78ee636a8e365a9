"""Downsampled ImageNet 32×32 (Chrabaszcz et al., 2017) from its pickled batches.

The release is a directory with ``train_data_batch_1`` … ``train_data_batch_10`` and
``val_data``; each is a pickled dict with ``data`` (N × 3072 uint8 rows, channel-major:
1024 bytes of R, then G, then B, each a row-major 32×32 plane) and ``labels`` (ints
1 … 1000, converted here to 0 … 999).  An optional ``mean`` key is ignored.

Pickles can run code, so they are read with an unpickler that only admits the numpy
globals needed to rebuild arrays; anything else is reported as a corrupted file.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from .arrays import ArrayData, ArraySplit
from .errors import DataError

NUM_CLASSES = 1000
IMAGE_SIZE = 32
ROW_BYTES = 3 * IMAGE_SIZE * IMAGE_SIZE
TRAIN_FILES = tuple(f"train_data_batch_{i}" for i in range(1, 11))
VAL_FILE = "val_data"

_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    *((f"numpy.{core}.multiarray", name) for core in ("core", "_core") for name in ("_reconstruct", "scalar")),
    *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Admit only the globals that rebuild numpy arrays (no arbitrary code execution)."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing global {module}.{name}")
        return super().find_class(module, name)


def read_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch as (N×32×32×3 uint8 HWC images, int64 labels 0-based)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; expected an ImageNet32 pickled batch")
    try:
        with open(path, "rb") as f:
            # latin1 decodes Python-2 str payloads (numpy buffers) byte-for-byte.
            obj = _ArrayUnpickler(f, encoding="latin1").load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise DataError(f"{path}: corrupted or truncated pickle ({type(e).__name__}: {e}); "
                        f"expected a pickled dict with 'data' and 'labels'") from None
    if isinstance(obj, dict):
        obj = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}
    if not isinstance(obj, dict) or "data" not in obj or "labels" not in obj:
        found = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise DataError(f"{path}: pickle holds {found}; expected a dict with 'data' and 'labels' keys")
    data = np.asarray(obj["data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != ROW_BYTES:
        raise DataError(f"{path}: 'data' is {data.dtype} {data.shape}; expected uint8 N×{ROW_BYTES} "
                        f"(channel-major 32×32 RGB rows)")
    try:
        labels = np.asarray(obj["labels"], dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise DataError(f"{path}: 'labels' not integers ({e}); expected ints 1..{NUM_CLASSES}") from None
    if labels.shape[0] != data.shape[0]:
        raise DataError(f"{path}: {labels.shape[0]} labels for {data.shape[0]} rows; expected one label per row")
    if labels.size and (labels.min() < 1 or labels.max() > NUM_CLASSES):
        raise DataError(f"{path}: labels span {labels.min()}..{labels.max()}; expected 1..{NUM_CLASSES} (1-based)")
    return rows_to_hwc(data), labels - 1


def rows_to_hwc(rows: np.ndarray) -> np.ndarray:
    """Channel-major N×3072 rows -> N×32×32×3 (contiguous)."""
    return np.ascontiguousarray(rows.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1))


def _read_split(root: Path, names: tuple[str, ...]) -> ArraySplit:
    """Concatenate batches into one preallocated array (peak memory ≈ result + one batch)."""
    raw = []
    for name in names:
        path = root / name
        if not path.is_file():
            raise DataError(f"{path}: missing; expected ImageNet32 files {names[0]}"
                            f"{' … ' + names[-1] if len(names) > 1 else ''} in {root}")
        raw.append(read_batch(path))
    total = sum(len(lbl) for _, lbl in raw)
    images = np.empty((total, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    labels = np.empty(total, dtype=np.int64)
    pos = 0
    while raw:
        img, lbl = raw.pop(0)
        images[pos:pos + len(lbl)], labels[pos:pos + len(lbl)] = img, lbl
        pos += len(lbl)
    return ArraySplit(images, labels)


def load_imagenet32(source: str | Path) -> ArrayData:
    """Read the ImageNet32 release directory (train batches 1-10 and ``val_data`` as test)."""
    root = Path(source)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; expected the ImageNet32 release with "
                        f"{TRAIN_FILES[0]} … {TRAIN_FILES[-1]} and {VAL_FILE}")
    train = _read_split(root, TRAIN_FILES)
    test = _read_split(root, (VAL_FILE,))
    return ArrayData("imagenet32", train, test, num_classes=NUM_CLASSES, class_names=None,
                     source={"kind": "imagenet32-pickles", "path": str(root)})
