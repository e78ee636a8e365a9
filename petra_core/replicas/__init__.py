"""Replica rules: what the R replicas of a pipeline stage do together around its optimizer step.

A rule is a small policy object, independent of the storage policy (``petra_core.methods``) and
combinable with every method: :class:`ReplicaRule` names its two hooks (before and after a
stage's step), :class:`ReplicaGroup` is what it may ask of the R copies of one stage (collectives
over the replica axis of the mesh), and ``REPLICA_RULES`` lists the rules by name.
"""
from .rule import REPLICA_RULES, DataParallel, ReplicaGroup, ReplicaRule, StageCopy, get_rule

__all__ = ["REPLICA_RULES", "DataParallel", "ReplicaGroup", "ReplicaRule", "StageCopy", "get_rule"]
