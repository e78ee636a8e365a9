"""Full-resolution ImageNet as an image-folder root, decoded per sample (never converted).

The root must hold ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG`` (the validation
images sorted into class folders, as torchvision's ``ImageFolder`` expects).  Samples are
listed with ``ImageFolder``; augmentation follows the paper — RandomResizedCrop(224) +
horizontal flip for training, Resize(256) + CenterCrop(224) for evaluation — but every
random parameter is drawn from a caller-supplied ``torch.Generator`` using
``torchvision.transforms.v2`` functional ops, so a sample's augmentation is reproducible.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.transforms.v2 import functional as F

from .errors import DataError

CROP = 224
RESIZE = 256


@dataclass(frozen=True)
class FolderData:
    """Train/val ``ImageFolder`` datasets of an ImageNet-style root."""

    name: str
    root: Path
    train: ImageFolder
    test: ImageFolder
    class_names: tuple[str, ...]
    source: dict = field(default_factory=dict)
    manifest: dict | None = None  # set when loaded from a prepared directory

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_size(self) -> int:
        return CROP


def _class_dirs(split_dir: Path) -> list[str]:
    return sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def load_imagenet(source: str | Path, *, name: str = "imagenet") -> FolderData:
    """Validate ``source`` (train/ and val/ with identical class folders) and list its samples."""
    root = Path(source)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; expected an ImageNet root with train/<class>/ and val/<class>/")
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise DataError(f"{root / split}: no such directory; expected {split}/<class>/<image> under {root}")
    train_classes, val_classes = _class_dirs(root / "train"), _class_dirs(root / "val")
    if not train_classes:
        raise DataError(f"{root / 'train'}: no class directories; expected train/<class>/<image>")
    if train_classes != val_classes:
        diff = sorted(set(train_classes) ^ set(val_classes))[:5]
        raise DataError(f"{root}: inconsistent class lists between train/ ({len(train_classes)}) and val/ "
                        f"({len(val_classes)}), e.g. {diff}; expected the same class folders "
                        f"(sort val images into class folders first)")
    try:
        train, test = ImageFolder(str(root / "train")), ImageFolder(str(root / "val"))
    except (FileNotFoundError, OSError) as e:
        raise DataError(f"{root}: cannot list images ({e}); expected image files in every class folder") from None
    return FolderData(name, root, train, test, tuple(train_classes), source={"kind": "image-folder", "path": str(root)})


def listing_digest(folder: ImageFolder) -> str:
    """sha256 of the sorted relative paths and labels: detects added, removed or moved files."""
    h = hashlib.sha256()
    root = Path(folder.root)
    for path, label in folder.samples:
        h.update(f"{Path(path).relative_to(root).as_posix()}\t{label}\n".encode())
    return h.hexdigest()


def random_resized_crop_params(height: int, width: int, generator: torch.Generator,
                               scale: tuple[float, float] = (0.08, 1.0),
                               ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, h, w) as ``torchvision.transforms.RandomResizedCrop.get_params``, from ``generator``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        u = torch.rand(2, generator=generator).tolist()
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u[1])
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    in_ratio = width / height  # fallback: central crop clamped to the ratio range
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_transform(image: Image.Image, generator: torch.Generator, size: int = CROP) -> torch.Tensor:
    """RandomResizedCrop(size) + horizontal flip with parameters from ``generator``; uint8 3×size×size."""
    image = image.convert("RGB")
    top, left, h, w = random_resized_crop_params(image.height, image.width, generator)
    image = F.resized_crop(image, top, left, h, w, [size, size], antialias=True)
    if bool(torch.rand(1, generator=generator) < 0.5):
        image = F.horizontal_flip(image)
    return F.pil_to_tensor(image)


def eval_transform(image: Image.Image, size: int = CROP, resize: int = RESIZE) -> torch.Tensor:
    """Resize(resize) of the shorter side + CenterCrop(size); uint8 3×size×size."""
    image = F.center_crop(F.resize(image.convert("RGB"), [resize], antialias=True), [size, size])
    return F.pil_to_tensor(image)
