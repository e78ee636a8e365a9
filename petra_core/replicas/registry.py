"""The replica rules by name. A new rule is usable from a config once :func:`register_rule` has its
class; everything else about it (options, stage groups, schedules, replicas it needs) is declared
on the class (``ReplicaRule``) and read from there."""

from __future__ import annotations

import dataclasses
import typing

from .acco import ACCO, DPU, ShardedRule, WeightPrediction
from .cdp import CDP1, CDP2
from .options import RuleOptions, build_options
from .population import PAPA, WASH, Independent
from .rule import DataParallel, Init, ReplicaRule

INITS = typing.get_args(Init)

REPLICA_RULES: dict[str, type[ReplicaRule]] = {}


def register_rule(rule: type[ReplicaRule]) -> type[ReplicaRule]:
    """Make ``rule`` available by its ``name`` (a config's ``replica_rule``), after checking its
    declaration; returns it (usable as a class decorator)."""
    if not (isinstance(rule, type) and issubclass(rule, ReplicaRule)):
        raise ValueError(f"register_rule takes a ReplicaRule subclass, got {rule!r}")
    if not isinstance(rule.name, str) or not rule.name or rule.name == ReplicaRule.name:
        raise ValueError(f"replica rule {rule.__qualname__} declares no name of its own (name={rule.name!r})")
    if rule.name in REPLICA_RULES and REPLICA_RULES[rule.name] is not rule:
        raise ValueError(f"replica rule name {rule.name!r} is taken (by {REPLICA_RULES[rule.name].__qualname__})")
    options = rule.Options
    if not (dataclasses.is_dataclass(options) and issubclass(options, RuleOptions)):
        raise ValueError(f"replica rule {rule.name!r}: Options={options!r} is not a RuleOptions dataclass")
    if rule.init not in INITS:
        raise ValueError(f"replica rule {rule.name!r}: init={rule.init!r} is not allowed; allowed: {', '.join(INITS)}")
    REPLICA_RULES[rule.name] = rule
    return rule


for _rule in (DataParallel, CDP1, CDP2, Independent, PAPA, WASH, ShardedRule, DPU, WeightPrediction, ACCO):
    register_rule(_rule)


def get_rule(
    rule: str | ReplicaRule | None, *, stages: int | None = None, options: dict | None = None, seed: int | None = None
) -> ReplicaRule:
    """A fresh rule by name (``REPLICA_RULES``), an instance as is, None: ``dp``. ``stages``: the
    groups L of a staged rule (``cdp1``, ``cdp2``); ``options``: the rule's own settings, fields of
    its ``Options`` (e.g. ``{"p": 0.01}`` for ``wash``); ``seed``: the run's (rules that draw at
    random read it). An undeclared option or a value its declaration refuses: one line."""
    if isinstance(rule, ReplicaRule):
        return rule
    name = "dp" if rule is None else rule
    if name not in REPLICA_RULES:
        raise ValueError(f"unknown replica rule {name!r}; allowed: {', '.join(REPLICA_RULES)}")
    cls = REPLICA_RULES[name]
    settings = dict(options or {})
    build_options(name, cls.Options, settings)  # an undeclared option (``seed`` too): one line, before the call
    return cls(stages=stages, seed=0 if seed is None else seed, **settings)
