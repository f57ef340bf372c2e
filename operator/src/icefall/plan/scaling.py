"""How many compaction pods a table gets, from its backlog. Pure.

`backlog` counts units of compaction work that can proceed in parallel (a partition or file group that
needs rewriting, each claimed by one pod through a work Lease); measuring it is the compaction issue's job.

Rule: no backlog → 0 pods (compaction costs nothing while the table is tidy). Otherwise one pod per
`items_per_replica` units, rounded up, at least `min_replicas` (and at least 1), at most `max_replicas`.

Not guaranteed: smoothing. A backlog that flaps between 0 and 1 scales between 0 and 1 pod; damping, if
needed, belongs to the caller (e.g. keep the previous count for a cool-down period).
"""

from __future__ import annotations


def compaction_replicas(
    backlog: int, min_replicas: int, max_replicas: int, *, items_per_replica: int = 1
) -> int:
    """Replicas for the compaction Deployment (see the module doc)."""
    if backlog < 0:
        raise ValueError(f"backlog must be >= 0, got {backlog}")
    if min_replicas < 0 or max_replicas < min_replicas:
        raise ValueError(f"need 0 <= min_replicas ({min_replicas}) <= max_replicas ({max_replicas})")
    if items_per_replica < 1:
        raise ValueError(f"items_per_replica must be >= 1, got {items_per_replica}")
    if backlog == 0 or max_replicas == 0:
        return 0
    wanted = -(-backlog // items_per_replica)  # ceiling division
    return min(max(wanted, min_replicas, 1), max_replicas)
