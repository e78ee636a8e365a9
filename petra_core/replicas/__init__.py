"""Replica rules: what the R replicas of a pipeline stage do together around its optimizer step.

A rule is a small policy object, independent of the storage policy (``petra_core.methods``) and
combinable with every method: :class:`ReplicaRule` names its hooks (``rule.py``); ``dp``
(``rule.py``), Cyclic Data Parallelism's ``cdp1`` and ``cdp2`` (``cdp.py``), the populations
``independent``, ``papa`` and ``wash`` (``population.py``) and the sharded-optimizer rules
``zero1``, ``dpu``, ``wp`` and ACCO's ``acco`` (``acco.py``, over ``sharded.py``; ACCO's timing
mode on ranks: ``timing.py``) are the rules. :class:`ReplicaGroup` is what a rule may ask of the
R copies of one stage (collectives over the replica axis of the mesh), and ``REPLICA_RULES``
lists the rules by name (:func:`register_rule` adds one). What a rule takes and needs is declared
on its class: its options (a :class:`RuleOptions` dataclass, ``options.py``), whether it is staged,
the schedules it runs on, whether it needs replicas > 1, how the replicas start (``init``).
"""

from .cdp import CDP1, CDP2, CyclicDataParallel
from .options import RuleOptions
from .registry import REPLICA_RULES, get_rule, register_rule
from .rule import DataParallel, ReplicaGroup, ReplicaRule, StageCopy

__all__ = [
    "CDP1",
    "CDP2",
    "REPLICA_RULES",
    "CyclicDataParallel",
    "DataParallel",
    "ReplicaGroup",
    "ReplicaRule",
    "RuleOptions",
    "StageCopy",
    "get_rule",
    "register_rule",
]
