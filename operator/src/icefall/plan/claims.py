"""Which StreamingTable owns a catalog table when several name the same one. Pure.

Two StreamingTables that name the same Iceberg table (same catalog name, namespace and table name,
compared case-insensitively, as catalogs such as the JDBC one and most REST servers fold them) would run
two writers against one table. The older one wins: the earliest `creationTimestamp`, then the smaller
uid (timestamps have one-second resolution). A Delta table with a location is its folder
(`TableIdentity.of_delta_folder`): two StreamingTables giving one folder claim one table whatever they
name it. The winner runs as usual; every other one holds no driver and
says `Ready=False`, reason `TableClaimedByOther`, naming the winner.

Guarantees: every observer that sees the same claims picks the same winner, whatever order it sees them in;
a claimant keeps its claim while it is being deleted (its driver may still be stopping).

Not guaranteed: that two catalog configurations that reach the same database under different names are
recognised as one (the identity is the catalog *name*, which a sql catalog stores with each table).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from icefall.api import StreamingTable
from icefall.plan.names import TableIdentity


@dataclass(frozen=True)
class Claim:
    """One StreamingTable naming a catalog table."""

    created: datetime
    uid: str
    namespace: str
    name: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def table_identity(st: StreamingTable) -> str:
    """`TableIdentity.key`: equal for StreamingTables naming one catalog table (the same one their Leases
    are named by)."""
    return TableIdentity.of(st).key


def winner(claims: Iterable[Claim]) -> Claim | None:
    """The claim that owns the table: the oldest, ties broken by uid; None when there are none."""
    return min(claims, key=lambda c: (c.created, c.uid), default=None)


def claimed_by_other(me: Claim, claims: Iterable[Claim]) -> Claim | None:
    """The winner when it is not `me` (then `me` must not write), else None. `me` counts as a claim."""
    found = winner([me, *claims])
    return None if found is None or found.uid == me.uid else found


def claim_from_object(obj: Mapping[str, Any]) -> Claim | None:
    """The claim of a StreamingTable API object (None without a creationTimestamp or uid: not stored yet)."""
    meta = obj.get("metadata") or {}
    created, uid = meta.get("creationTimestamp"), meta.get("uid")
    if not created or not uid:
        return None
    when = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    return Claim(when, str(uid), str(meta.get("namespace") or ""), str(meta.get("name") or ""))
