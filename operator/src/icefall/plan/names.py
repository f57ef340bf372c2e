"""The one place that names what Icefall puts in Kubernetes: child objects, Leases, labels, annotation keys.
Pure: no client, no I/O.

| what | name |
|---|---|
| driver Pod | `<st>-ingest` (`driver_pod_name`); Spark executors are named after it |
| executors' pod template ConfigMap | `<st>-ingest-executor` (`executor_template_name`) |
| compaction Deployment | `<st>-compact` (`compaction_name`) |
| driver ServiceAccount, Role, RoleBinding | `icefall-<st>-driver` (`driver_account_name`) |
| compaction ServiceAccount, Role, RoleBinding | `icefall-<st>-compact` (`compaction_account_name`) |
| commit Lease | `icefall-<table>-commit` (`commit_lease_name`) |
| yield Lease | `icefall-<table>-yield` (`rewrite_yield_name`) |
| work Leases | `icefall-<table>-work-<hash>` (`work_lease_name`) |
| the operator's leader Lease | `icefall-operator-leader` (`LEADER_LEASE_NAME`) |

`<st>` is the StreamingTable's name, `<table>` the catalog table's name (`StreamingTable.table_name`).

Guarantees: deterministic; every name is a valid object name of at most 63 characters (a long name keeps
its head plus a hash of the whole). Not guaranteed (yet): two StreamingTables whose catalog tables share
a name but not a namespace or catalog get different Lease names: Leases are keyed by the bare table name.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

# --- labels and annotation keys ---------------------------------------------------------------------------

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_STREAMINGTABLE = "icefall.dev/streamingtable"
#: The submission id (`icefall.plan.children.spec_hash`) a child was rendered from.
LABEL_SPEC_HASH = "icefall.dev/spec-hash"
APP_NAME = "icefall"
#: `managed-by` of every child, and the operator's one field manager.
MANAGED_BY = "icefall-operator"
COMPONENT_INGEST = "ingest"
COMPONENT_COMPACT = "compact"
#: Labels of the Leases the pods and the operator write (`icefall.commit.kube_lease`).
LEASE_LABELS: Mapping[str, str] = {LABEL_MANAGED_BY: APP_NAME}

#: The prefix of kopf's own annotations and finalizer on a StreamingTable.
ANNOTATION_PREFIX = "icefall.dev"
#: The generation of the StreamingTable a child was rendered from (intent, recorded before launching).
ANNOTATION_GENERATION = "icefall.dev/generation"
#: The driver's restart history on the StreamingTable (`icefall.plan.driver.DriverHistory`).
ANNOTATION_DRIVER_HISTORY = "icefall.dev/driver-history"


def labels(name: str, component: str) -> dict[str, str]:
    """The labels of every child of the StreamingTable `name` (without the spec hash)."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_STREAMINGTABLE: name,
    }


def selector_labels(name: str, component: str) -> dict[str, str]:
    """The immutable subset of labels used in selectors (never the spec hash)."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_COMPONENT: component}


# --- child objects ----------------------------------------------------------------------------------------

MAX_NAME_LENGTH = 63


def digest(text: str) -> str:
    """The hex SHA-256 of `text` (names and the spec hash take a prefix of it)."""
    return hashlib.sha256(text.encode()).hexdigest()


def child_name(prefix: str, table: str, suffix: str) -> str:
    """`<prefix><table><suffix>`, at most 63 characters: a long table name keeps its head plus a hash."""
    name = f"{prefix}{table}{suffix}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    hashed = digest(table)[:8]
    room = MAX_NAME_LENGTH - len(prefix) - len(suffix) - len(hashed) - 1
    if room < 1:
        raise ValueError(f"no room for a table name in {prefix!r}...{suffix!r}")
    return f"{prefix}{table[:room].rstrip('-.')}-{hashed}{suffix}"


def driver_pod_name(table: str) -> str:
    return child_name("", table, "-ingest")


def executor_template_name(table: str) -> str:
    return child_name("", table, "-ingest-executor")


def compaction_name(table: str) -> str:
    return child_name("", table, "-compact")


def driver_account_name(table: str) -> str:
    """Name of the driver's ServiceAccount, Role and RoleBinding."""
    return child_name("icefall-", table, "-driver")


def compaction_account_name(table: str) -> str:
    """Name of the compaction pods' ServiceAccount, Role and RoleBinding."""
    return child_name("icefall-", table, "-compact")


def spark_app_name(table: str, role: str = COMPONENT_INGEST) -> str:
    """The Spark application name of a process working on the StreamingTable `table`: `icefall-<st>` for
    ingestion, `icefall-<st>-compact` for compaction, `icefall-<role>-<st>` for the CLI's `verify` and
    `read`."""
    if role == COMPONENT_INGEST:
        return f"icefall-{table}"
    if role == COMPONENT_COMPACT:
        return f"icefall-{table}-compact"
    return f"icefall-{role}-{table}"


# --- Leases -----------------------------------------------------------------------------------------------

LEADER_LEASE_NAME = "icefall-operator-leader"
_WORK_HASH_CHARS = 10


def commit_lease_name(table: str) -> str:
    """The per-table commit lease, `icefall-<table>-commit`, as a valid Kubernetes object name."""
    slug = re.sub(r"[^a-z0-9.-]+", "-", table.lower()).strip("-.")
    if not slug:
        raise ValueError(f"cannot derive a lease name from table name {table!r}")
    return f"icefall-{slug}-commit"


def rewrite_yield_name(table: str) -> str:
    """The per-table yield Lease, `icefall-<table>-yield`: held by a rewrite that ingestion lets go first."""
    return commit_lease_name(table).removesuffix("-commit") + "-yield"


def work_lease_name(table: str, identity: Mapping[str, object]) -> str:
    """A work item's Lease, `icefall-<table>-work-<hash>`: a DNS label of at most 63 characters. The hash
    covers `identity` (what makes the item one, `icefall.plan.maintenance.work_key`) and the full table
    name, so tables whose names truncate to the same slug still get different names."""
    hashed = digest(json.dumps({**identity, "table": table}, sort_keys=True))[:_WORK_HASH_CHARS]
    room = MAX_NAME_LENGTH - len("icefall-") - len("-work-") - _WORK_HASH_CHARS
    slug = re.sub(r"[^a-z0-9-]+", "-", table.lower())[:room].strip("-")
    if not slug:
        raise ValueError(f"cannot derive a lease name from table name {table!r}")
    return f"icefall-{slug}-work-{hashed}"
