"""Validation of :func:`build_model` arguments: one-line errors that list what is allowed."""

from __future__ import annotations

from .specs import ARCHS, STEMS


def check_build_args(arch: object, *, num_classes: object, stem: object, width: object) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; allowed: {', '.join(ARCHS)}")
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; allowed: {', '.join(STEMS)}")
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"width must be an integer >= 1, got {width!r}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
