"""The replica rules by name: a row here is all a new rule needs to be usable from a config."""
from __future__ import annotations

from .cdp import CDP1, CDP2
from .rule import DataParallel, ReplicaRule

REPLICA_RULES: dict[str, type[ReplicaRule]] = {"dp": DataParallel, "cdp1": CDP1, "cdp2": CDP2}


STAGED = ("cdp1", "cdp2")  # the rules that take ``stages`` (the cyclic delay's groups)


def get_rule(rule: str | ReplicaRule | None, *, stages: int | None = None) -> ReplicaRule:
    """A fresh rule by name (``REPLICA_RULES``), an instance as is, None: ``dp``. ``stages``: the
    groups L of a cyclic rule (``cdp1``, ``cdp2``)."""
    if isinstance(rule, ReplicaRule):
        return rule
    name = "dp" if rule is None else rule
    if name not in REPLICA_RULES:
        raise ValueError(f"unknown replica rule {name!r}; allowed: {', '.join(REPLICA_RULES)}")
    if name in STAGED:
        return REPLICA_RULES[name](stages)
    if stages is not None:
        raise ValueError(f"replica rule {name!r} takes no stage groups (stages={stages!r}); only {', '.join(STAGED)} do")
    return REPLICA_RULES[name]()
