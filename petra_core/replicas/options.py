"""A replica rule's settings, declared: a frozen dataclass whose fields are the options it accepts.

A rule names its options class (``ReplicaRule.Options``); each field is one setting, with its type
and default. Nothing is read from a constructor's signature: :func:`build_options` refuses a name
that is not a field, and :class:`RuleOptions` refuses a value of the wrong type (a ``Literal``
field: a value outside its choices), in one line each. A rule adds the checks of its own ranges
in ``check`` (``0 <= p <= 1``). Floats given as integers become floats, as YAML writes ``rate: 1``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class RuleOptions:
    """The options of a rule that takes none; a rule's own options subclass this."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for name, value in self.items():
            if not _conforms(value, hints[name]):
                raise ValueError(f"{name}={value!r} is not allowed; allowed: {_describe(hints[name])}")
        self.check()  # on the values as given, so a message quotes them so
        for name, value in self.items():
            if hints[name] is float:
                object.__setattr__(self, name, float(value))

    def check(self) -> None:
        """Raise ValueError (one line, ``name=value is not allowed; allowed: ...``) for a value out of range."""

    def items(self) -> list[tuple[str, object]]:
        """(name, value) of every option, in declaration order."""
        return list(dataclasses.asdict(self).items())


def option_names(options: type[RuleOptions]) -> list[str]:
    return [f.name for f in dataclasses.fields(options)]


def build_options(rule: str, options: type[RuleOptions], values: dict) -> RuleOptions:
    """``options`` made from ``values``, refusing (one line, naming rule ``rule``) an undeclared
    option or a value the declaration does not allow."""
    allowed = option_names(options)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(
            f"replica rule {rule!r} has no option {unknown[0]!r}; allowed: {', '.join(allowed) if allowed else 'none'}"
        )
    try:
        return options(**values)
    except ValueError as err:
        raise ValueError(f"{rule}: {err}") from None


def _conforms(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    raise TypeError(f"an option of type {hint!r} cannot be declared; use bool, int, float, str, a Literal or None")


def _describe(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is type(None):
        return "null"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[hint]
