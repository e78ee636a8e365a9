"""The replica rules by name: a row here is all a new rule needs to be usable from a config."""

from __future__ import annotations

import inspect

from .acco import ACCO, DPU, ShardedRule, WeightPrediction
from .cdp import CDP1, CDP2
from .population import PAPA, WASH, Independent
from .rule import DataParallel, ReplicaRule

REPLICA_RULES: dict[str, type[ReplicaRule]] = {
    "dp": DataParallel,
    "cdp1": CDP1,
    "cdp2": CDP2,
    "independent": Independent,
    "papa": PAPA,
    "wash": WASH,
    "zero1": ShardedRule,
    "dpu": DPU,
    "wp": WeightPrediction,
    "acco": ACCO,
}


STAGED = ("cdp1", "cdp2")  # the rules that take ``stages`` (the cyclic delay's groups)


def rule_options(name: str) -> dict:
    """The options rule ``name`` takes (its constructor's keyword arguments) and their defaults."""
    params = inspect.signature(REPLICA_RULES[name].__init__).parameters
    return {k: p.default for k, p in params.items() if k != "self" and k not in ("stages", "seed")}


def get_rule(
    rule: str | ReplicaRule | None, *, stages: int | None = None, options: dict | None = None, seed: int | None = None
) -> ReplicaRule:
    """A fresh rule by name (``REPLICA_RULES``), an instance as is, None: ``dp``. ``stages``: the
    groups L of a cyclic rule (``cdp1``, ``cdp2``); ``options``: the rule's own settings (e.g.
    ``{"p": 0.01}`` for ``wash``); ``seed``: the run's, for rules that draw at random."""
    if isinstance(rule, ReplicaRule):
        return rule
    name = "dp" if rule is None else rule
    if name not in REPLICA_RULES:
        raise ValueError(f"unknown replica rule {name!r}; allowed: {', '.join(REPLICA_RULES)}")
    kwargs = dict(options or {})
    allowed = rule_options(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"replica rule {name!r} has no option {unknown[0]!r}; allowed: {', '.join(allowed) if allowed else 'none'}"
        )
    if name in STAGED:
        kwargs["stages"] = stages
    elif stages is not None:
        raise ValueError(
            f"replica rule {name!r} takes no stage groups (stages={stages!r}); only {', '.join(STAGED)} do"
        )
    if seed is not None and "seed" in inspect.signature(REPLICA_RULES[name].__init__).parameters:
        kwargs["seed"] = seed
    return REPLICA_RULES[name](**kwargs)
