"""Oracles for the data layer: exact formats written in tmp_path, checksums, determinism, resumption."""

import pickle
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from petra_core.data import (
    DATASETS,
    SOURCES,
    ArrayData,
    ArraySplit,
    DataError,
    DataSource,
    FolderMinibatchStream,
    MinibatchStream,
    Normalization,
    build_data,
    crop_flip,
    load_cifar10,
    load_imagenet,
    load_imagenet32,
    load_prepared,
    load_source,
    make_synthetic,
    prepare,
    read_image_folder,
    read_image_tar,
    read_torchvision_cifar10,
    register_source,
)
from petra_core.data.imagenet import random_resized_crop_params
from petra_core.data.synthetic import make_templates
from petra_core.run.config import RunConfig

CLASSES = ("cat", "ant", "bee")  # written unsorted; labels must follow sorted order ant=0, bee=1, cat=2
REAL_CIFAR = Path(__file__).resolve().parents[1].parent / "shared/data/cifar10-jpeg.tar.gz"


# ---------------------------------------------------------------- fixtures: files in the exact formats


def _pixels(split: str, cls: str, i: int, smooth: bool) -> np.ndarray:
    """Deterministic 32×32×3 content; smooth images survive JPEG nearly unchanged."""
    rng = np.random.default_rng([("train", "test").index(split), CLASSES.index(cls), i, int(smooth)])
    if not smooth:
        return rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    yy, xx = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    base = rng.integers(40, 200, 3)
    return np.clip(base[None, None, :] + (yy + xx)[:, :, None], 0, 255).astype(np.uint8)


def write_tree(root: Path, ext: str, per_split=(("train", 4), ("test", 2))) -> dict:
    """ROOT/<split>/<class>/<i>.<ext>; returns {(split, class, i): pixels}."""
    written = {}
    for split, n in per_split:
        for cls in CLASSES:
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                arr = _pixels(split, cls, i, smooth=(ext == "jpg"))
                Image.fromarray(arr).save(root / split / cls / f"{i:04d}.{ext}", quality=95)
                written[(split, cls, i)] = arr
    return written


def write_tar(tree: Path, out: Path, wrapper: str | None = None) -> Path:
    with tarfile.open(out, "w:gz") as tf:
        for split in ("test", "train"):  # deliberately not in train/test order
            tf.add(tree / split, arcname=f"{wrapper}/{split}" if wrapper else split)
    return out


@pytest.fixture
def png_tree(tmp_path):
    written = write_tree(tmp_path / "tree", "png")
    return tmp_path / "tree", written


@pytest.fixture
def png_tar(png_tree, tmp_path):
    return write_tar(png_tree[0], tmp_path / "tree.tar.gz")


def write_imagenet32(root: Path, rows_per_batch=3, val_rows=4, bad: dict | None = None) -> dict:
    """Pickled batches in the release layout; returns {file name: (data, labels)}."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = {}
    for name in [f"train_data_batch_{i}" for i in range(1, 11)] + ["val_data"]:
        n = val_rows if name == "val_data" else rows_per_batch
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(x) for x in rng.integers(1, 1001, n)]
        obj = {"data": data, "labels": labels, "mean": np.zeros(3072)}
        if bad and name in bad:
            obj = bad[name](obj)
        with open(root / name, "wb") as f:
            pickle.dump(obj, f)
        out[name] = (data, labels)
    return out


# ---------------------------------------------------------------- image folders and tarballs


def test_png_folder_exact_pixels_and_sorted_labels(png_tree):
    root, written = png_tree
    data = read_image_folder(root, name="t")
    assert data.class_names == ("ant", "bee", "cat") and data.num_classes == 3
    assert data.train.images.shape == (12, 32, 32, 3) and data.train.images.dtype == np.uint8
    assert data.test.images.shape == (6, 32, 32, 3) and data.test.labels.dtype == np.int64
    assert data.train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    for k, cls in enumerate(sorted(CLASSES)):  # order: class, then file name
        for i in range(4):
            np.testing.assert_array_equal(data.train.images[k * 4 + i], written[("train", cls, i)])


def test_jpeg_folder_approx_pixels(tmp_path):
    written = write_tree(tmp_path / "jpg", "jpg")
    data = load_cifar10(tmp_path / "jpg")
    got = data.test.images[2 * 2 + 1].astype(int)  # class "cat" (label 2), file 0001
    assert data.test.labels[5] == 2
    assert np.abs(got - written[("test", "cat", 1)]).mean() < 3


@pytest.mark.parametrize("wrapper", [None, "cifar10"])
def test_tarball_equals_folder(png_tree, tmp_path, wrapper):
    tar = write_tar(png_tree[0], tmp_path / "t.tar.gz", wrapper)
    a, b = read_image_folder(png_tree[0], name="t"), read_image_tar(tar, name="t")
    assert a.class_names == b.class_names
    for split in ("train", "test"):
        np.testing.assert_array_equal(getattr(a, split).images, getattr(b, split).images)
        np.testing.assert_array_equal(getattr(a, split).labels, getattr(b, split).labels)


def test_cifar10_source_autodetect_and_missing(png_tree, png_tar, tmp_path):
    np.testing.assert_array_equal(load_cifar10(png_tree[0]).train.images, load_cifar10(png_tar).train.images)
    with pytest.raises(DataError, match="no such file or directory"):
        load_cifar10(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="download=True"):
        load_cifar10(tmp_path / "empty")
    with pytest.raises(DataError, match="cifar-10-batches-py"):
        read_torchvision_cifar10(tmp_path / "empty")


def test_truncated_and_corrupted_tarball(png_tar, tmp_path):
    raw = png_tar.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    for n in (len(raw) // 2, len(raw) - 4, 30):
        cut.write_bytes(raw[:n])
        with pytest.raises(DataError, match="truncated or corrupted archive"):
            read_image_tar(cut, name="t")
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    cut.write_bytes(bytes(flipped))
    with pytest.raises(DataError, match="cut.tar.gz"):
        read_image_tar(cut, name="t")


def test_folder_structure_errors(tmp_path):
    (tmp_path / "a/train").mkdir(parents=True)
    (tmp_path / "a/test").mkdir()
    with pytest.raises(DataError, match="no class directories"):
        read_image_folder(tmp_path / "a", name="t")
    write_tree(tmp_path / "b", "png")
    (tmp_path / "b/test/cat").rename(tmp_path / "b/test/dog")
    with pytest.raises(DataError, match=r"inconsistent class lists.*cat.*dog"):
        read_image_folder(tmp_path / "b", name="t")
    write_tree(tmp_path / "c", "png")
    (tmp_path / "c/train/ant/0000.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match="0000.png: cannot decode"):
        read_image_folder(tmp_path / "c", name="t")
    write_tree(tmp_path / "d", "png")
    Image.new("RGB", (16, 16)).save(tmp_path / "d/test/bee/0000.png")
    with pytest.raises(DataError, match="expected 32×32"):
        load_cifar10(tmp_path / "d")


# ---------------------------------------------------------------- ImageNet32 pickles


def test_imagenet32_layout_labels_and_known_pixel(tmp_path):
    written = write_imagenet32(tmp_path / "in32")
    data = load_imagenet32(tmp_path / "in32")
    assert data.train.images.shape == (30, 32, 32, 3) and data.test.images.shape == (4, 32, 32, 3)
    assert data.num_classes == 1000 and data.train.labels.dtype == np.int64
    rows, labels = written["train_data_batch_2"]  # batch 2 follows batch 1 (not "10" after "1")
    # Channel-major row: byte c*1024 + y*32 + x is channel c of pixel (y, x).
    assert data.train.images[3 + 1, 5, 7, 1] == rows[1, 1024 + 5 * 32 + 7]
    assert data.train.images[3 + 1, 31, 0, 2] == rows[1, 2048 + 31 * 32 + 0]
    assert data.train.labels[3 + 1] == labels[1] - 1
    val_rows, val_labels = written["val_data"]
    np.testing.assert_array_equal(data.test.images, val_rows.reshape(4, 3, 32, 32).transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(data.test.labels, np.array(val_labels) - 1)


class _Evil:
    def __reduce__(self):
        return (print, ("executed",))


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda o: {"labels": o["labels"]}, "expected a dict with 'data' and 'labels'"),
        (lambda o: {**o, "data": o["data"][:, :3000]}, "expected uint8 N×3072"),
        (lambda o: {**o, "labels": [0] * len(o["labels"])}, "expected 1..1000"),
        (lambda o: {**o, "labels": o["labels"][:-1]}, "one label per row"),
        (lambda o: {**o, "extra": _Evil()}, "refusing global builtins.print"),
    ],
)
def test_imagenet32_bad_pickles(tmp_path, bad, match):
    write_imagenet32(tmp_path / "in32", bad={"train_data_batch_7": bad})
    with pytest.raises(DataError, match=rf"train_data_batch_7: .*{match}"):
        load_imagenet32(tmp_path / "in32")


def test_imagenet32_truncated_and_missing(tmp_path):
    write_imagenet32(tmp_path / "in32")
    path = tmp_path / "in32/val_data"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(DataError, match="val_data: corrupted or truncated pickle"):
        load_imagenet32(tmp_path / "in32")
    (tmp_path / "in32/train_data_batch_10").unlink()
    with pytest.raises(DataError, match="train_data_batch_10: missing"):
        load_imagenet32(tmp_path / "in32")
    with pytest.raises(DataError, match="nowhere: no such directory"):
        load_imagenet32(tmp_path / "nowhere")


# ---------------------------------------------------------------- preparation


def test_prepare_round_trip_and_manifest(png_tar, tmp_path):
    out = prepare("cifar10", png_tar, tmp_path / "prepared/cifar10")
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == ["cifar10"]  # no temp dirs left
    assert out.stat().st_mode & 0o755 == 0o755
    loaded, direct = load_prepared(out), load_cifar10(png_tar)
    for split in ("train", "test"):
        np.testing.assert_array_equal(getattr(loaded, split).images, getattr(direct, split).images)
        np.testing.assert_array_equal(getattr(loaded, split).labels, getattr(direct, split).labels)
    m = loaded.manifest
    assert m["dataset"] == "cifar10" and m["num_classes"] == 3 and m["class_names"] == ["ant", "bee", "cat"]
    assert m["splits"]["train"]["images_shape"] == [12, 32, 32, 3] and m["splits"]["test"]["class_counts"] == [2] * 3
    assert m["source"]["kind"] == "image-tar" and len(m["source"]["sha256"]) == 64
    assert set(m["files"]) == {"train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy"}


def test_tampered_file_fails_checksum(png_tar, tmp_path):
    out = prepare("cifar10", png_tar, tmp_path / "p")
    arr = np.load(out / "test_labels.npy")
    arr[0] = (arr[0] + 1) % 3
    np.save(out / "test_labels.npy", arr)
    with pytest.raises(DataError, match=r"test_labels.npy: checksum mismatch \(expected sha256 [0-9a-f]{12}…, got "):
        load_prepared(out)
    load_prepared(out, verify=False)  # explicitly skipping verification still loads


def test_failed_prepare_leaves_nothing_and_existing_needs_overwrite(png_tar, tmp_path):
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(png_tar.read_bytes()[:-100])
    (tmp_path / "prep").mkdir()
    with pytest.raises(DataError, match="truncated"):
        prepare("cifar10", cut, tmp_path / "prep/c")
    assert list((tmp_path / "prep").iterdir()) == []
    out = prepare("cifar10", png_tar, tmp_path / "prep/c")
    with pytest.raises(DataError, match="already exists"):
        prepare("cifar10", png_tar, tmp_path / "prep/c")
    prepare("synthetic", None, out, overwrite=True, n_train=20, n_test=10)
    assert load_prepared(out).name == "synthetic" and len(list((tmp_path / "prep").iterdir())) == 1
    with pytest.raises(DataError, match="manifest.json: missing"):
        load_prepared(tmp_path / "prep")
    with pytest.raises(DataError, match="no such directory"):
        load_prepared(tmp_path / "absent")


# ---------------------------------------------------------------- synthetic data


def test_synthetic_is_a_pure_function_of_its_parameters():
    a, b = make_synthetic(n_train=200, n_test=50, seed=3), make_synthetic(n_train=200, n_test=50, seed=3)
    c = make_synthetic(n_train=200, n_test=50, seed=4)
    np.testing.assert_array_equal(a.train.images, b.train.images)
    np.testing.assert_array_equal(a.test.labels, b.test.labels)
    assert not np.array_equal(a.train.images, c.train.images)
    assert a.train.images.shape == (200, 32, 32, 3) and np.bincount(a.train.labels).tolist() == [20] * 10
    assert make_synthetic(num_classes=4, n_train=8, n_test=4, image_size=16).test.images.shape == (4, 16, 16, 3)


def test_synthetic_is_learnable():
    data = make_synthetic(n_train=1000, n_test=300, seed=0)
    templates = make_templates(10, 32, 0)
    x = data.test.images.transpose(0, 3, 1, 2) / 255.0
    nearest = ((x[:, None] - templates[None]) ** 2).sum((2, 3, 4)).argmin(1)
    assert (nearest == data.test.labels).mean() > 0.9
    # A linear softmax classifier (zero init, no global RNG) on augmented stream batches.
    bundle = build_data("synthetic", batch_size=50, seed=0, n_train=1000, n_test=300)
    model = torch.nn.Linear(3 * 32 * 32, 10)
    torch.nn.init.zeros_(model.weight), torch.nn.init.zeros_(model.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(40):
        xb, yb = bundle.train.batch(step // 20, step % 20)
        loss = torch.nn.functional.cross_entropy(model(xb.flatten(1)), yb)
        opt.zero_grad(), loss.backward(), opt.step()
    with torch.no_grad():
        correct = sum((model(xb.flatten(1)).argmax(1) == yb).sum().item() for xb, yb in bundle.test.iter_epoch(0))
    assert correct / 300 > 0.5  # chance is 0.1


# ---------------------------------------------------------------- streams


@pytest.fixture(scope="module")
def split():
    return make_synthetic(n_train=230, n_test=70, seed=1).train


def test_batches_are_pure_functions_of_seed_epoch_index(split):
    s1 = MinibatchStream(split, 32, seed=5, train=True)
    s2 = MinibatchStream(split, 32, seed=5, train=True)
    s2.batch(3, 1)  # touch another epoch first: no hidden state
    for epoch, index in [(0, 0), (0, 6), (2, 3)]:
        (x1, y1), (x2, y2) = s1.batch(epoch, index), s2.batch(epoch, index)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert s1.num_batches == 7 and x1.shape == (32, 3, 32, 32) and x1.dtype == torch.float32 and y1.dtype == torch.int64
    assert not np.array_equal(s1.order(0), s1.order(1))
    assert sorted(s1.order(1).tolist()) == list(range(230))
    assert not np.array_equal(MinibatchStream(split, 32, seed=6, train=True).order(0), s1.order(0))


def test_resume_mid_epoch_matches_the_full_epoch(split):
    full = list(MinibatchStream(split, 32, seed=0, train=True).iter_epoch(4))
    resumed = list(MinibatchStream(split, 32, seed=0, train=True).iter_epoch(4, start=5))
    assert len(full) == 7 and len(resumed) == 2
    for (xa, ya), (xb, yb) in zip(full[5:], resumed):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_augmentation_varies_and_keeps_shape(split):
    s = MinibatchStream(split, 64, seed=0, train=True)
    raw, _ = s.raw_batch(0, 0)
    plain = torch.from_numpy(split.images[s.batch_indices(0, 0)])
    assert raw.shape == plain.shape and raw.dtype == torch.uint8
    changed = (raw != plain).flatten(1).any(1)
    assert 0.5 < changed.float().mean() <= 1.0  # most samples shifted and/or flipped
    assert torch.equal(s.raw_batch(0, 0)[0], raw)  # and reproducible


def test_crop_flip_matches_a_reference_loop():
    images = torch.randint(0, 256, (16, 8, 8, 3), dtype=torch.uint8)
    out = crop_flip(images, torch.Generator().manual_seed(0), pad=2)
    g = torch.Generator().manual_seed(0)
    oy, ox = torch.randint(0, 5, (16,), generator=g), torch.randint(0, 5, (16,), generator=g)
    flips = torch.rand(16, generator=g) < 0.5
    padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2), (2, 2, 2, 2)).permute(0, 2, 3, 1)
    for n in range(16):
        ref = padded[n, oy[n] : oy[n] + 8, ox[n] : ox[n] + 8]
        assert torch.equal(out[n], ref.flip(1) if flips[n] else ref)
    assert 0 < flips.sum() < 16 and len(set(zip(oy.tolist(), ox.tolist()))) > 1
    only_flip = crop_flip(images, torch.Generator().manual_seed(1), pad=0)
    assert all(torch.equal(o, i) or torch.equal(o, i.flip(1)) for o, i in zip(only_flip, images))


def test_eval_stream_covers_every_example_once_in_order():
    data = make_synthetic(n_train=20, n_test=70, seed=2)
    s = MinibatchStream(data.test, 32, seed=0, train=False)  # drop_last only applies to training
    batches = list(s.iter_epoch(0))
    assert [len(y) for _, y in batches] == [32, 32, 6]
    np.testing.assert_array_equal(torch.cat([y for _, y in batches]).numpy(), data.test.labels)
    expected = (data.test.images[:32].transpose(0, 3, 1, 2) / 255.0).astype(np.float32)
    np.testing.assert_allclose(batches[0][0].numpy(), expected, atol=1e-6)  # norm=None: no augmentation
    assert torch.equal(s.batch(0, 1)[0], s.batch(9, 1)[0])
    with pytest.raises(IndexError):
        s.batch(0, 3)


def test_stream_argument_errors(split):
    with pytest.raises(DataError, match="batch_size=1000"):
        MinibatchStream(split, 1000, seed=0, train=True)
    with pytest.raises(DataError, match="seed=-1"):
        MinibatchStream(split, 10, seed=-1, train=True)


# ---------------------------------------------------------------- front door


def test_build_data_front_door(tmp_path, png_tar):
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; expected one of cifar10, imagenet32, imagenet"):
        build_data("mnist", batch_size=4, seed=0)
    assert set(DATASETS) == {"cifar10", "imagenet32", "imagenet", "synthetic", "shakespeare", "botchan"}
    b = build_data("cifar10", source=png_tar, prepared_dir=tmp_path / "p", batch_size=4, seed=0)
    assert (b.num_classes, b.image_size, b.stem, b.train.num_batches, b.test.num_batches) == (3, 32, "cifar", 3, 2)
    assert b.manifest["files"] and (tmp_path / "p/manifest.json").is_file()
    again = build_data("cifar10", prepared_dir=tmp_path / "p", batch_size=4, seed=0)  # no source needed now
    assert torch.equal(again.train.batch(1, 2)[0], b.train.batch(1, 2)[0])
    with pytest.raises(DataError, match="holds 'cifar10'; expected 'synthetic'"):
        build_data("synthetic", prepared_dir=tmp_path / "p", batch_size=4, seed=0)
    syn = build_data(
        "synthetic", prepared_dir=tmp_path / "s", batch_size=8, seed=0, subset=40, data_seed=2, n_train=100, n_test=30
    )
    assert syn.subset == 40 and syn.train.num_examples == 40 and syn.train.num_batches == 5
    assert syn.manifest["params"] == {"n_train": 100, "n_test": 30, "seed": 2}
    with pytest.raises(DataError, match="other parameters"):
        build_data("synthetic", prepared_dir=tmp_path / "s", batch_size=8, seed=0, n_train=50)
    with pytest.raises(DataError, match="unknown parameter"):
        build_data("synthetic", batch_size=8, seed=0, colour=True)
    with pytest.raises(DataError, match="no source given"):
        build_data("imagenet32", batch_size=8, seed=0)


def stripes(n: int = 8, level: int = 200) -> ArrayData:
    """A toy generated dataset: class c is a bright row at height c (two classes)."""
    images = np.zeros((n, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(n, dtype=np.int64) % 2
    images[np.arange(n), labels] = level
    split = ArraySplit(images, labels)
    return ArrayData("toy-stripes", split, split, num_classes=2)


@pytest.fixture
def toy_source():
    source = register_source(
        DataSource("toy-stripes", stripes, "cifar", Normalization((0.5,) * 3, (0.5,) * 3), ("n", "level"), True)
    )
    yield source
    SOURCES.pop(source.name)


def test_a_data_source_declared_outside_the_registry_works_once_registered(toy_source):
    assert "toy-stripes" in DATASETS
    b = build_data("toy-stripes", batch_size=4, seed=0, n=12)
    assert (b.num_classes, b.image_size, b.stem, b.train.num_batches) == (2, 32, "cifar", 3)
    assert b.normalization == toy_source.normalization and b.manifest["params"] == {"n": 12}
    cfg = RunConfig.from_dict({"dataset": "toy-stripes"})  # generated: no data_source needed
    assert cfg.dataset == "toy-stripes"


def test_an_undeclared_data_source_parameter_is_refused_with_one_line(toy_source):
    for name, params, needle in (
        ("toy-stripes", {"colour": True}, "toy-stripes: unknown parameter 'colour'; allowed: n, level"),
        ("imagenet32", {"download": True}, "imagenet32: unknown parameter 'download'; allowed: none"),
        ("synthetic", {"n_val": 3}, "synthetic: unknown parameter 'n_val'; allowed: num_classes, n_train"),
    ):
        with pytest.raises(DataError) as err:
            load_source(name, **params)
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="data_seed=1 given for toy-stripes; expected it only for a generated dataset"):
        build_data("toy-stripes", batch_size=4, seed=0, data_seed=1)
    with pytest.raises(DataError, match="data source name 'synthetic' is taken"):
        register_source(DataSource("synthetic", stripes, "cifar", toy_source.normalization))


# ---------------------------------------------------------------- full-size ImageNet folder


@pytest.fixture
def imagenet_root(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 5), ("val", 2)):
        for cls in ("n01", "n02"):
            (tmp_path / "in" / split / cls).mkdir(parents=True)
            for i in range(n):
                size = (40 + 8 * i, 30 + 4 * i, 3)
                Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)).save(
                    tmp_path / "in" / split / cls / f"{i}.jpg"
                )
    return tmp_path / "in"


def test_imagenet_folder_streams(imagenet_root, tmp_path):
    data = load_imagenet(imagenet_root)
    assert data.num_classes == 2 and len(data.train) == 10 and len(data.test) == 4
    s1 = FolderMinibatchStream(data.train, 4, seed=0, train=True, size=24, resize=28)
    s2 = FolderMinibatchStream(data.train, 4, seed=0, train=True, size=24, resize=28, num_workers=2)
    x, y = s1.batch(1, 1)
    assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.int64
    resumed = list(s2.iter_epoch(1, start=1))  # via DataLoader workers
    assert len(resumed) == 1 and torch.equal(resumed[0][0], x) and torch.equal(resumed[0][1], y)
    assert not torch.equal(s1.batch(2, 1)[0], x)
    ev = FolderMinibatchStream(data.test, 3, seed=0, train=False, size=24, resize=28)
    assert [len(y) for _, y in ev.iter_epoch(0)] == [3, 1]
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        top, left, h, w = random_resized_crop_params(30, 40, g)
        assert top >= 0 and top + h <= 30 and left >= 0 and left + w <= 40 and h > 0 and w > 0


def test_imagenet_prepare_records_root(imagenet_root, tmp_path):
    out = prepare("imagenet", imagenet_root, tmp_path / "prep")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
    b = build_data("imagenet", prepared_dir=out, batch_size=4, seed=0)
    assert (b.num_classes, b.image_size, b.stem) == (2, 224, "imagenet")
    assert b.manifest["splits"]["train"]["num_examples"] == 10
    Image.new("RGB", (30, 30)).save(imagenet_root / "train/n01/extra.jpg")
    with pytest.raises(DataError, match="train listing changed"):
        load_prepared(out)
    (imagenet_root / "val/n02").rename(imagenet_root / "val/n03")
    with pytest.raises(DataError, match="inconsistent class lists"):
        load_imagenet(imagenet_root)


# ---------------------------------------------------------------- the real CIFAR-10 tarball


@pytest.mark.slow
@pytest.mark.skipif(not REAL_CIFAR.is_file(), reason=f"{REAL_CIFAR} not present")
def test_real_cifar10_tarball(tmp_path):
    t0 = time.perf_counter()
    out = prepare("cifar10", REAL_CIFAR, tmp_path / "cifar10")
    t1 = time.perf_counter()
    data = load_prepared(out)
    t2 = time.perf_counter()
    print(f"\nprepare real CIFAR-10 tarball: {t1 - t0:.1f} s; load_prepared with verification: {t2 - t1:.2f} s")
    assert data.train.images.shape == (50000, 32, 32, 3) and data.test.images.shape == (10000, 32, 32, 3)
    assert data.class_names == (
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    )
    assert np.bincount(data.train.labels).tolist() == [5000] * 10
    assert np.bincount(data.test.labels).tolist() == [1000] * 10
    mean = data.train.images.reshape(-1, 3).mean(0) / 255
    np.testing.assert_allclose(mean, (0.4914, 0.4822, 0.4465), atol=0.005)  # the standard CIFAR-10 statistics
