"""How many compaction pods a table gets, from its backlog. Pure.

`backlog` counts units of compaction work that can proceed in parallel (a partition or file group that
needs rewriting, each claimed by one pod through a work Lease); measuring it is the compaction issue's job.

Rule: one pod per `items_per_replica` units of backlog, rounded up, at least `min_replicas`, at most
`max_replicas`. With the default `min_replicas` 0, no backlog → 0 pods (compaction costs nothing while
the table is tidy); a `min_replicas` above 0 keeps that many pods even then, as the spec field promises.

`damped_replicas` smooths the result: scaling up happens at once, scaling down only once the previous count
has held for a cool-down, so a backlog that flaps between 0 and 1 does not start and stop pods each pass.
Not guaranteed: anything across operator restarts (the caller keeps the previous count in memory).
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
    wanted = -(-backlog // items_per_replica)  # ceiling division
    return min(max(wanted, min_replicas), max_replicas)


def damped_replicas(
    wanted: int,
    current: int | None,
    changed_at: float | None,
    now: float,
    *,
    cooldown_seconds: float,
) -> int:
    """`wanted`, except that a scale-down waits until `cooldown_seconds` have passed since the last change.

    `current` is the replica count last set (None: nothing set yet) and `changed_at` when it was set
    (seconds, any clock the caller also passes as `now`). Scaling up is never delayed: work should not wait.
    """
    if cooldown_seconds < 0:
        raise ValueError(f"cooldown_seconds must be >= 0, got {cooldown_seconds}")
    if current is None or changed_at is None or wanted >= current:
        return wanted
    return wanted if now - changed_at >= cooldown_seconds else current
