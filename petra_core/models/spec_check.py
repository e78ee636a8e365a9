"""Validation of model build arguments (the image family's, and integer and choice checks any family
uses): one-line errors that name the value and list what is allowed."""

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


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an integer >= ``minimum`` (not a bool), else one line naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_choice(name: str, value: object, allowed) -> object:
    """``value`` if it is one of ``allowed``, else one line naming it and what is allowed."""
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(str(a) for a in allowed)}")
    return value
