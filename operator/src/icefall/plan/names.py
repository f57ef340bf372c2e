"""The one place that names what Icefall puts in Kubernetes: child objects, Leases, labels, annotation keys.
Pure: no client, no I/O.

| what | name |
|---|---|
| driver Pod | `<st>-ingest` (`driver_pod_name`); Spark executors are named after it |
| executors' pod template ConfigMap | `<st>-ingest-executor` (`executor_template_name`) |
| compaction Deployment | `<st>-compact` (`compaction_name`) |
| purge Job (`deletionPolicy: Delete`) | `<st>-purge` (`purge_job_name`) |
| driver ServiceAccount, Role, RoleBinding | `icefall-<st>-driver` (`driver_account_name`) |
| compaction ServiceAccount, Role, RoleBinding | `icefall-<st>-compact` (`compaction_account_name`) |
| Spark RPC Secret (Kubernetes master) | `icefall-<st>-spark-auth` (`spark_auth_secret_name`) |
| NetworkPolicy of the table's pods | `icefall-<st>-ingress` (`network_policy_name`) |
| commit Lease | `icefall-<table>-<id>-commit` (`TableLeases.commit`) |
| yield Lease | `icefall-<table>-<id>-yield` (`TableLeases.rewrite_yield`) |
| work Leases | `icefall-<table>-<id>-work-<slot>`, a fixed pool (`TableLeases.work`) |
| a route table's yield and work Leases | the same, of its own identity (`destination_leases`) |
| a dynamic route's tables' yield and work Leases | one set, the route's identity (`dynamic_route_leases`) |
| the operator's leader Lease | `icefall-operator-leader` (`LEADER_LEASE_NAME`) |

`<st>` is the StreamingTable's name (unique in its namespace), `<table>` the catalog table's name and
`<id>` a hash of the table's whole identity (`TableIdentity`: catalog, Iceberg namespace, table), so
`sales.orders` and `staging.orders`, or two catalogs' `orders`, never share a Lease.

One rule for every name: `<prefix><readable part><suffix>` of at most 63 characters, lowercase and
DNS-safe; where the readable part does not make the name unique (Leases), or is cut to fit, a hash of the
whole follows it. Deterministic: every process working on a table derives the same names from its spec.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from icefall.api import StreamingTable

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
COMPONENT_PURGE = "purge"
#: Labels of the Leases the pods and the operator write (`icefall.commit.kube_lease`).
LEASE_LABELS: Mapping[str, str] = {LABEL_MANAGED_BY: APP_NAME}

#: The prefix of kopf's own annotations and finalizer on a StreamingTable.
ANNOTATION_PREFIX = "icefall.dev"
#: The generation of the StreamingTable a child was rendered from (intent, recorded before launching).
ANNOTATION_GENERATION = "icefall.dev/generation"
#: The driver's restart history on the StreamingTable (`icefall.plan.driver.DriverHistory`).
ANNOTATION_DRIVER_HISTORY = "icefall.dev/driver-history"
#: A request to reset the table's offsets in a cluster (`icefall.plan.offset_reset`).
ANNOTATION_RESET_OFFSETS = "icefall.dev/reset-offsets"


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


def purge_job_name(table: str) -> str:
    return child_name("", table, "-purge")


def driver_account_name(table: str) -> str:
    """Name of the driver's ServiceAccount, Role and RoleBinding."""
    return child_name("icefall-", table, "-driver")


def compaction_account_name(table: str) -> str:
    """Name of the compaction pods' ServiceAccount, Role and RoleBinding."""
    return child_name("icefall-", table, "-compact")


def spark_auth_secret_name(table: str) -> str:
    """Name of the Secret the driver and executors authenticate Spark's RPC with (`plan.isolation`)."""
    return child_name("icefall-", table, "-spark-auth")


def network_policy_name(table: str) -> str:
    """Name of the NetworkPolicy around the table's pods (`plan.isolation`)."""
    return child_name("icefall-", table, "-ingress")


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
#: Work Leases per table: a fixed pool, so the compaction Role can name each one (`resourceNames`). An item
#: takes the slot its key hashes to; two items that share a slot run one after the other.
WORK_LEASE_SLOTS = 16
_IDENTITY_HASH_CHARS = 8
_LONGEST_LEASE_SUFFIX = f"-work-{WORK_LEASE_SLOTS - 1:02d}"


@dataclass(frozen=True)
class TableIdentity:
    """What makes a table one: its catalog (name and URI; both empty for the runner's default catalog), its
    Iceberg namespace and its name, lower-cased but for the URI (Iceberg's Spark catalogs match names
    case-insensitively). Two StreamingTables with the same identity write the same table: they share its
    Leases, and the older one wins it (`icefall.plan.claims`)."""

    catalog: str
    catalog_uri: str
    namespace: str
    table: str

    @classmethod
    def of(cls, st: StreamingTable, identifier: tuple[str, ...] | None = None) -> TableIdentity:
        """The identity of `st`'s table, or of another table it writes in its catalog (`identifier`: a
        route's table, `StreamingTable.destination_identifiers`)."""
        location = st.spec.table.location
        if identifier is None and st.spec.table.format.value == "delta" and location is not None:
            return cls.of_delta_folder(str(location))
        catalog = st.spec.table.catalog
        *namespace, table = identifier or st.table_identifier
        return cls(
            catalog=catalog.name.lower() if catalog else "",
            catalog_uri=catalog.uri if catalog else "",
            namespace=".".join(namespace).lower(),
            table=table.lower(),
        )

    @classmethod
    def of_delta_folder(cls, location: str) -> TableIdentity:
        """A Delta table with a location is its folder, whatever a StreamingTable names it: two that give one
        folder (`s3a://` is `s3://`, `abfs://` is `abfss://`, a trailing '/' aside) write one table, and the
        older one wins it."""
        folder = re.sub(r"^abfs://", "abfss://", re.sub(r"^s3a://", "s3://", location)).rstrip("/")
        return cls(catalog="delta", catalog_uri=folder, namespace="", table=folder.rsplit("/", 1)[-1].lower())

    @property
    def key(self) -> str:
        """`catalog/namespace/table`, with the catalog's URI when it has one: one string per identity."""
        catalog = f"{self.catalog}@{self.catalog_uri}" if self.catalog_uri else self.catalog
        return f"{catalog}/{self.namespace}/{self.table}"

    @property
    def hash(self) -> str:
        return digest(self.key)[:_IDENTITY_HASH_CHARS]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class TableLeases:
    """The names of one table's Leases (module doc). Every process that works on the table takes them from
    here: the driver (commit), compaction (yield, work) and the operator (the Roles that name them)."""

    identity: TableIdentity

    @property
    def _stem(self) -> str:
        room = MAX_NAME_LENGTH - len("icefall-") - 1 - _IDENTITY_HASH_CHARS - len(_LONGEST_LEASE_SUFFIX)
        slug = _slug(self.identity.table)[:room].strip("-") or "table"
        return f"icefall-{slug}-{self.identity.hash}"

    @property
    def commit(self) -> str:
        return f"{self._stem}-commit"

    @property
    def rewrite_yield(self) -> str:
        """Held by a rewrite that ingestion lets go first (`icefall.ingest.engine.wait_for_rewrite`)."""
        return f"{self._stem}-yield"

    @property
    def work(self) -> tuple[str, ...]:
        """The pool of work Leases, `-work-00` to `-work-15`."""
        return tuple(f"{self._stem}-work-{slot:02d}" for slot in range(WORK_LEASE_SLOTS))

    def work_for(self, key: str) -> str:
        """The work Lease of the item whose key (`icefall.plan.maintenance.work_key`) is `key`."""
        return self.work[int(digest(key)[:8], 16) % WORK_LEASE_SLOTS]

    @property
    def legacy_commit(self) -> str | None:
        """The commit Lease of versions before identity-keyed names (`icefall-<bare table name>-commit`),
        or None where those versions could not have made one (a name over 63 characters). A writer takes
        it before its own commit Lease and lets it go at once (`icefall.commit.lease.SuccessorLease`), so a
        writer of an older version still running is waited out during an upgrade."""
        slug = re.sub(r"[^a-z0-9.-]+", "-", self.identity.table.lower()).strip("-.")
        name = f"icefall-{slug}-commit"
        return name if slug and len(name) <= MAX_NAME_LENGTH else None


def table_leases(st: StreamingTable) -> TableLeases:
    return TableLeases(TableIdentity.of(st))


def destination_leases(st: StreamingTable) -> tuple[TableLeases, ...]:
    """The Leases of each table `st` writes (`StreamingTable.destination_identifiers`: spec.table's
    first): compaction claims each table's work with that table's own work and yield Leases. Only
    spec.table's commit Lease is taken: its driver commits every destination while it holds it."""
    # spec.table's by `TableIdentity.of(st)` (a Delta table's folder), as `table_leases` and the Leases the
    # operator creates: the compaction Role must name the work Leases its pods take.
    return tuple(
        TableLeases(TableIdentity.of(st, None if n == 0 else i))
        for n, i in enumerate(st.destination_identifiers)
    )


#: The suffix of a dynamic route's identity (`dynamic_route_leases`): '-' is never in a table's name
#: (`IDENTIFIER_PATTERN`), so no table's identity is a dynamic route's.
DYNAMIC_ROUTE_SUFFIX = "-dynamic"


def dynamic_route_leases(st: StreamingTable) -> TableLeases | None:
    """The yield and work Leases every table `st`'s dynamic route creates shares (None without
    `spec.dynamicRoute`): their names are not known in advance, so the Role cannot name a set per table,
    and a Role that may touch every Lease of the namespace would not be least privilege. One more identity
    instead: spec.table's with `DYNAMIC_ROUTE_SUFFIX` (the owner of the tables, `DYNAMIC_OWNER_PROPERTY`);
    a work item of a dynamic table takes the work Lease of its table and key (`TableLeases.work_for`).
    Like a route table's, no commit Lease: the driver commits them under spec.table's."""
    if st.spec.dynamic_route is None:
        return None
    owner = TableIdentity.of(st)
    return TableLeases(replace(owner, table=owner.table + DYNAMIC_ROUTE_SUFFIX))


def maintained_leases(st: StreamingTable) -> tuple[TableLeases, ...]:
    """The Leases compaction of `st` claims work with: each destination's (`destination_leases`), then the
    dynamic route's (`dynamic_route_leases`) when it has one."""
    dynamic = dynamic_route_leases(st)
    return (*destination_leases(st), *((dynamic,) if dynamic is not None else ()))
