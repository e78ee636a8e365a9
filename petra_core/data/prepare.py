"""Convert a raw source once into a fast, checksummed local form, atomically.

``prepare`` writes ``train_images.npy``, ``train_labels.npy``, ``test_images.npy``,
``test_labels.npy`` and a ``manifest.json`` (dataset, shapes, classes, source, sha256 of
every file) into a temporary sibling directory, fsyncs it, then ``os.replace``s it into
place: an interrupted or failed preparation never leaves a half-written dataset (at worst
a hidden ``.NAME.tmp-*`` sibling).  ``load_prepared`` verifies the checksums and
memory-maps the arrays.  ImageNet is not copied: its manifest records and validates the
root (class list, file counts and a digest of the file listing).  A text corpus (``text.py``)
is written as ``train_tokens.npy`` and ``test_tokens.npy`` (uint8 token ids), its manifest
holding the vocabulary and the works of each split.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from .arrays import ArrayData, ArraySplit
from .errors import DataError
from .imagenet import FolderData, listing_digest, load_imagenet
from .sources import load_source
from .text import TextData

FORMAT = "petra-prepared/1"
MANIFEST = "manifest.json"
ARRAY_FILES = ("train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy")
TEXT_FILES = ("train_tokens.npy", "test_tokens.npy")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def describe(data: ArrayData | FolderData | TextData) -> dict:
    """The manifest of ``data`` without file checksums (also used for unprepared data)."""
    if isinstance(data, TextData):
        return {"format": FORMAT, "dataset": data.name, "kind": "text", "num_classes": data.num_classes,
                "vocab": data.vocab, "source": data.source,
                "splits": {split: {"num_tokens": len(getattr(data, split)), "works": data.works[split]}
                           for split in ("train", "test")}}
    out = {"format": FORMAT, "dataset": data.name, "num_classes": data.num_classes,
           "class_names": list(data.class_names) if data.class_names is not None else None,
           "image_size": data.image_size, "source": data.source}
    if isinstance(data, FolderData):
        out["kind"] = "image-folder"
        out["root"] = str(data.root.resolve())
        out["splits"] = {split: {"num_examples": len(ds), "listing_sha256": listing_digest(ds),
                                 "class_counts": np.bincount(ds.targets, minlength=data.num_classes).tolist()}
                         for split, ds in (("train", data.train), ("test", data.test))}
        return out
    out["kind"] = "arrays"
    out["splits"] = {split: {"num_examples": len(s), "images_shape": list(s.images.shape),
                             "class_counts": np.bincount(s.labels, minlength=data.num_classes).tolist()}
                     for split, s in (("train", data.train), ("test", data.test))}
    return out


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not supported on every platform/filesystem
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_file(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_directory(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary sibling of ``out_dir``; on success move it into place, on error delete it."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists() and not overwrite:
        raise DataError(f"{out_dir}: already exists; expected a new directory (to replace it: petra prepare --overwrite, or prepare(..., overwrite=True))")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700; a dataset directory should be readable
        _fsync_dir(tmp)
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old)  # a directory may replace an empty one
        os.replace(tmp, out_dir)
        _fsync_dir(out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as err:  # a full disk names no file; the temporary one is gone: name out_dir
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(err.errno, err.strerror, str(out_dir)) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare(name: str, source: str | Path | None, out_dir: str | Path, *, overwrite: bool = False,
            **params) -> Path:
    """Read ``source`` as dataset ``name`` and write its prepared form to ``out_dir``; returns ``out_dir``."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:  # fail before the (slow) read
        raise DataError(f"{out_dir}: already exists; expected a new directory (to replace it: petra prepare --overwrite, or prepare(..., overwrite=True))")
    data = load_source(name, source, **params)
    manifest = describe(data)
    manifest["params"] = params
    if source is not None and Path(source).is_file():
        manifest["source"] = {**manifest["source"], "sha256": sha256_file(Path(source))}
    with atomic_directory(out_dir, overwrite) as tmp:
        files, arrays = {}, {}
        if isinstance(data, ArrayData):
            arrays = dict(zip(ARRAY_FILES, (data.train.images, data.train.labels, data.test.images, data.test.labels)))
        elif isinstance(data, TextData):
            arrays = dict(zip(TEXT_FILES, (data.train, data.test)))
        if arrays:
            for fname, arr in arrays.items():
                _write_file(tmp / fname, lambda f, a=arr: np.save(f, np.ascontiguousarray(a), allow_pickle=False))
                files[fname] = {"sha256": sha256_file(tmp / fname), "bytes": (tmp / fname).stat().st_size}
        manifest["files"] = files
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        _write_file(tmp / MANIFEST, lambda f: f.write(text.encode()))
    return out_dir


def read_manifest(prepared_dir: str | Path) -> dict:
    """The parsed ``manifest.json`` of a prepared directory (DataError if absent or invalid)."""
    path = Path(prepared_dir) / MANIFEST
    if not Path(prepared_dir).is_dir():
        raise DataError(f"{prepared_dir}: no such directory; expected a directory written by prepare()")
    if not path.is_file():
        raise DataError(f"{path}: missing; expected a directory written by prepare()")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: unreadable manifest ({e}); expected JSON written by prepare()") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise DataError(f"{path}: format {found!r}; expected {FORMAT!r}")
    return manifest


def _load_arrays(prepared_dir: Path, manifest: dict, names: tuple[str, ...], verify: bool) -> list[np.ndarray]:
    """The prepared ``names`` of ``prepared_dir``, memory-mapped, each checked against the manifest's sha256."""
    arrays = []
    for fname in names:
        path = prepared_dir / fname
        expected = manifest.get("files", {}).get(fname, {}).get("sha256")
        if not path.is_file() or expected is None:
            raise DataError(f"{path}: missing{' from the manifest' if path.is_file() else ''}; "
                            f"expected {', '.join(names)} as written by prepare()")
        if verify:
            actual = sha256_file(path)
            if actual != expected:
                raise DataError(f"{path}: checksum mismatch (expected sha256 {expected[:12]}…, got {actual[:12]}…); "
                                f"the prepared data is corrupted or modified, prepare it again")
        try:
            arrays.append(np.load(path, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError, EOFError) as e:
            raise DataError(f"{path}: unreadable array ({e}); expected a .npy written by prepare()") from None
    return arrays


def load_prepared(prepared_dir: str | Path, verify: bool = True) -> ArrayData | FolderData | TextData:
    """Load a prepared dataset (arrays memory-mapped read-only); ``verify`` checks every sha256."""
    prepared_dir = Path(prepared_dir)
    manifest = read_manifest(prepared_dir)
    if manifest.get("kind") == "image-folder":
        return _load_folder(prepared_dir, manifest, verify)
    if manifest.get("kind") == "text":
        return _load_text(prepared_dir, manifest, verify)
    arrays = _load_arrays(prepared_dir, manifest, ARRAY_FILES, verify)
    for split, (images, labels) in (("train", arrays[0:2]), ("test", arrays[2:4])):
        if list(images.shape) != manifest["splits"][split]["images_shape"]:
            raise DataError(f"{prepared_dir / (split + '_images.npy')}: shape {list(images.shape)}; "
                            f"expected {manifest['splits'][split]['images_shape']} from the manifest")
    names = manifest.get("class_names")
    return ArrayData(manifest["dataset"], ArraySplit(arrays[0], arrays[1]), ArraySplit(arrays[2], arrays[3]),
                     num_classes=int(manifest["num_classes"]), class_names=tuple(names) if names else None,
                     source=manifest.get("source", {}), manifest=manifest)


def _load_folder(prepared_dir: Path, manifest: dict, verify: bool) -> FolderData:
    data = load_imagenet(manifest["root"], name=manifest["dataset"])
    if list(data.class_names) != manifest["class_names"]:
        raise DataError(f"{data.root}: {data.num_classes} classes differ from the {len(manifest['class_names'])} "
                        f"recorded in {prepared_dir / MANIFEST}; expected the prepared class list")
    for split, ds in (("train", data.train), ("test", data.test)):
        rec = manifest["splits"][split]
        if len(ds) != rec["num_examples"] or (verify and listing_digest(ds) != rec["listing_sha256"]):
            raise DataError(f"{data.root}: {split} listing changed ({len(ds)} files, recorded {rec['num_examples']}) "
                            f"since {prepared_dir / MANIFEST} was written; expected the prepared file listing")
    return FolderData(data.name, data.root, data.train, data.test, data.class_names, data.source, manifest)


def _load_text(prepared_dir: Path, manifest: dict, verify: bool) -> TextData:
    train, test = _load_arrays(prepared_dir, manifest, TEXT_FILES, verify)
    for split, tokens in (("train", train), ("test", test)):
        if len(tokens) != manifest["splits"][split]["num_tokens"]:
            raise DataError(f"{prepared_dir / (split + '_tokens.npy')}: {len(tokens)} tokens; expected "
                            f"{manifest['splits'][split]['num_tokens']} from the manifest")
    works = {split: manifest["splits"][split]["works"] for split in ("train", "test")}
    return TextData(manifest["dataset"], train, test, manifest["vocab"], works, manifest.get("source", {}), manifest)
