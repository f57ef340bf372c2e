"""A table's Leases as children of its StreamingTable, created by the operator. Pure: no client, no I/O.

The operator creates every Lease a table's pods take (`icefall.plan.names.TableLeases`: the commit Lease,
the yield Lease and the fixed pool of work Leases), with the labels and the controller owner reference of
every other child (`icefall.plan.metadata`) but for the spec hash and generation: a Lease does not depend
on the spec (the table's identity is immutable), so a spec change does not apply 18 Leases again.

So the pods' Roles need no `create` on Leases, which RBAC cannot restrict by name: a table's pods can
touch only their own table's Leases, and no pod can create a Lease with a name and duration of its
choosing before the table exists.

Each Lease is applied with Icefall's duration for it (`icefall.plan.leases.lease_seconds`) and nothing else
of its spec: the holder fields belong to whoever holds it. Server-side apply (forced) therefore rewrites a
`leaseDurationSeconds` someone else set, and never touches a holder's record. Observers judge expiry with
Icefall's duration anyway, so a Lease written with another one cannot block a table in between.

Not guaranteed: that a Lease deleted behind the operator's back comes back at once. Leases change with
every renewal, so the operator does not watch them; it applies them again with the table's other children
when their rendering changes or at the next repair pass (`icefall.plan.applying.REPAIR_SECONDS`), and the
pods wait for it meanwhile, saying so in their log.
"""

from __future__ import annotations

from typing import Any

from icefall.api import StreamingTable
from icefall.plan.leases import lease_seconds
from icefall.plan.metadata import ChildMeta
from icefall.plan.names import (
    COMPONENT_COMPACT,
    COMPONENT_INGEST,
    labels,
    maintained_leases,
    table_leases,
)

Manifest = dict[str, Any]

API_VERSION = "coordination.k8s.io/v1"


def lease_children(meta: ChildMeta, st: StreamingTable) -> list[Manifest]:
    """The Leases of `st`'s table, to apply (commit Lease first, then the yield and work Leases), then the
    yield and work Leases of each route's table and those the dynamic route's tables share
    (`maintained_leases`: compaction tidies them all; the driver commits them under the table's commit
    Lease, so they have none)."""
    leases = table_leases(st)
    seconds = lease_seconds(leases)
    for route in maintained_leases(st)[1:]:
        seconds |= {name: s for name, s in lease_seconds(route).items() if name != route.commit}

    def metadata(name: str) -> Manifest:
        component = COMPONENT_INGEST if name == leases.commit else COMPONENT_COMPACT
        return {
            "name": name,
            "namespace": meta.namespace,
            "labels": labels(meta.name, component),
            "ownerReferences": [meta.owner()],
        }

    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Lease",
            "metadata": metadata(name),
            "spec": {"leaseDurationSeconds": seconds},
        }
        for name, seconds in seconds.items()
    ]
