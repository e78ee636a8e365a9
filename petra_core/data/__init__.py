"""Data layer of petra: sources -> prepared arrays -> deterministic, resumable minibatch streams.

Front door: :func:`build_data`.  Pieces: source readers (:func:`load_cifar10`,
:func:`load_imagenet32`, :func:`load_imagenet`, :func:`make_synthetic`), each declared as a
:class:`DataSource` (``SOURCES``; :func:`register_source` adds one), one-off
preparation (:func:`prepare`, :func:`load_prepared`), batched augmentation
(:func:`crop_flip`) and streams whose batches are pure functions of (seed, epoch, index)
(:class:`MinibatchStream`, :class:`FolderMinibatchStream`; for the character corpora,
:func:`read_shakespeare` and :func:`read_botchan`, :class:`TextStream`).
"""
from .arrays import ArrayData, ArraySplit, subset_indices, take_subset
from .augment import Normalization, crop_flip, to_model_input
from .bundle import DataBundle, build_data
from .cifar10 import load_cifar10, read_torchvision_cifar10
from .errors import DataError
from .imagefolder import read_image_folder, read_image_tar
from .imagenet import FolderData, eval_transform, load_imagenet, train_transform
from .imagenet32 import load_imagenet32, read_batch
from .prefetch import Prefetcher
from .prepare import describe, load_prepared, prepare, read_manifest
from .sources import DATASETS, SOURCES, DataSource, load_source, register_source
from .stream import FolderMinibatchStream, MinibatchStream
from .synthetic import make_synthetic
from .text import TextData, read_botchan, read_shakespeare
from .text_stream import TextStream

__all__ = [
    "ArrayData", "ArraySplit", "DATASETS", "DataBundle", "DataError", "DataSource", "FolderData",
    "FolderMinibatchStream", "MinibatchStream", "Normalization", "Prefetcher", "SOURCES", "build_data", "crop_flip",
    "describe", "eval_transform", "load_cifar10", "load_imagenet", "load_imagenet32", "load_prepared", "load_source",
    "make_synthetic", "prepare", "read_batch", "read_botchan", "read_shakespeare", "TextData", "TextStream", "read_image_folder", "read_image_tar", "read_manifest",
    "read_torchvision_cifar10", "register_source", "subset_indices", "take_subset", "to_model_input",
    "train_transform",
]
