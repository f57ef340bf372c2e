"""`status` of a StreamingTable: conditions, freshness, and a few table figures.

Guarantees:
- Condition types and reasons are closed enums; each reason is valid only for the condition types listed
  in `REASONS_BY_TYPE`, so a typo in a controller fails in tests instead of reaching users.
- The CRD stores a reason as any CamelCase word (`REASON_PATTERN`), not as the enum, with the known reasons
  listed in its description: Helm never upgrades a CRD, so a newer operator's new reasons must pass an
  older CRD. Condition types stay an enum in the CRD (a new type is an API change).
- `conditions` is a list keyed by `type` (at most one entry per type), as Kubernetes API conventions ask.
- Status is small: scalars for freshness and table shape, plus the per-partition lag map (which a writer
  may cap to the most lagging partitions). Anything larger or faster-changing belongs in metrics.
- Unknown status fields are ignored on read, so an older operator can read a newer one's status.

Not guaranteed: how `lastTransitionTime` evolves — keeping it unchanged unless `status` flips is the job of
whoever merges conditions (the plan layer).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, StringConstraints, WithJsonSchema, model_validator

from icefall.api.base import ProblemCollector, StatusModel


class ConditionType(StrEnum):
    """The conditions a StreamingTable reports. `Ready` summarises the others."""

    READY = "Ready"
    INGESTING = "Ingesting"
    FRESHNESS_MET = "FreshnessMet"
    DEGRADED = "Degraded"
    COMPACTING = "Compacting"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionReason(StrEnum):
    """Every reason a condition may carry (CamelCase, machine-readable)."""

    # Lifecycle, shared by several types.
    STARTING = "Starting"
    SUSPENDED = "Suspended"
    DELETING = "Deleting"
    INVALID_SPEC = "InvalidSpec"
    # Ready
    RUNNING = "Running"
    TABLE_CLAIMED = "TableClaimedByOther"
    # A referenced Secret is not granted to StreamingTables (label icefall.dev/streamingtables=allow).
    SECRET_NOT_ALLOWED = "SecretNotAllowed"
    CATALOG_UNAVAILABLE = "CatalogUnavailable"
    KAFKA_UNAVAILABLE = "KafkaUnavailable"
    # The driver's local disk (Spark's local dirs) is full; it waits for space, nothing is committed.
    LOCAL_DISK_FULL = "LocalDiskFull"
    # The driver's host clock is over a minute behind the table's last update; it waits until it passes.
    CLOCK_BEHIND = "ClockBehind"
    # The driver lost its Spark executors (no heartbeat: a network partition); it reads the batch again.
    EXECUTORS_LOST = "ExecutorsLost"
    # The service answered and refused the credentials (or TLS settings): a configuration error.
    CATALOG_CREDENTIALS_REFUSED = "CatalogCredentialsRefused"
    KAFKA_CREDENTIALS_REFUSED = "KafkaCredentialsRefused"
    DRIVER_FAILED = "DriverFailed"
    # Ingesting
    CATCHING_UP = "CatchingUp"
    CAUGHT_UP = "CaughtUp"
    WAITING_FOR_LEASE = "WaitingForLease"
    COMMIT_CONFLICT = "CommitConflict"
    # FreshnessMet
    WITHIN_TARGET = "WithinTarget"
    BEHIND_TARGET = "BehindTarget"
    NO_COMMITS_YET = "NoCommitsYet"
    NOT_MEASURED = "NotMeasured"
    # Degraded
    HEALTHY = "Healthy"
    DATA_LOSS = "DataLoss"
    OFFSETS_AHEAD_OF_TOPIC = "OffsetsAheadOfTopic"
    TOPIC_RECREATED = "TopicRecreated"
    BAD_RECORD_HALTED = "BadRecordHalted"
    # spec.source.onDataLoss: Halt, and retention deleted records before they were ingested.
    DATA_LOSS_HALTED = "DataLossHalted"
    DEAD_LETTER_FAILED = "DeadLetterFailed"
    SCHEMA_CHANGE_REFUSED = "SchemaChangeRefused"
    REGISTRY_UNAVAILABLE = "RegistryUnavailable"
    # spec.pods asks for what the operator's pod policy does not allow: no pod is created or changed.
    POD_POLICY_VIOLATION = "PodPolicyViolation"
    # Compacting
    COMPACTING = "Compacting"
    NO_COMPACTION_NEEDED = "NoCompactionNeeded"
    COMPACTION_FAILED = "CompactionFailed"
    # No compaction pods for this table's format yet (a Delta table in a cluster: commit/DESIGN.md).
    UPKEEP_NOT_AVAILABLE = "UpkeepNotAvailable"


#: A reason as the CRD stores it: CamelCase, as Kubernetes conventions ask, from any release of Icefall.
REASON_PATTERN = r"^[A-Z][A-Za-z0-9]*$"
REASON_MAX_LENGTH = 128
_REASON_CRD_SCHEMA = {
    "type": "string",
    "pattern": REASON_PATTERN,
    "minLength": 1,
    "maxLength": REASON_MAX_LENGTH,
}


_R = ConditionReason
_LIFECYCLE = frozenset({_R.STARTING, _R.SUSPENDED, _R.DELETING, _R.INVALID_SPEC})
#: Which reasons each condition type may carry. A Ready that is not True carries the reason of the
#: condition that made it so, hence every non-positive reason of Ingesting, FreshnessMet and Degraded.
REASONS_BY_TYPE: dict[ConditionType, frozenset[ConditionReason]] = {
    ConditionType.READY: _LIFECYCLE
    | {
        _R.RUNNING,
        _R.TABLE_CLAIMED,
        _R.SECRET_NOT_ALLOWED,
        _R.CATALOG_UNAVAILABLE,
        _R.KAFKA_UNAVAILABLE,
        _R.CATALOG_CREDENTIALS_REFUSED,
        _R.KAFKA_CREDENTIALS_REFUSED,
        _R.REGISTRY_UNAVAILABLE,
        _R.LOCAL_DISK_FULL,
        _R.CLOCK_BEHIND,
        _R.EXECUTORS_LOST,
        _R.DRIVER_FAILED,
        _R.WAITING_FOR_LEASE,
        _R.COMMIT_CONFLICT,
        _R.BEHIND_TARGET,
        _R.NO_COMMITS_YET,
        _R.NOT_MEASURED,
        _R.DATA_LOSS,
        _R.OFFSETS_AHEAD_OF_TOPIC,
        _R.TOPIC_RECREATED,
        _R.BAD_RECORD_HALTED,
        _R.DATA_LOSS_HALTED,
        _R.DEAD_LETTER_FAILED,
        _R.SCHEMA_CHANGE_REFUSED,
        _R.COMPACTION_FAILED,
        _R.POD_POLICY_VIOLATION,
    },
    ConditionType.INGESTING: _LIFECYCLE
    | {
        _R.CATCHING_UP,
        _R.CAUGHT_UP,
        _R.WAITING_FOR_LEASE,
        _R.COMMIT_CONFLICT,
        _R.DRIVER_FAILED,
        _R.CATALOG_UNAVAILABLE,
        _R.KAFKA_UNAVAILABLE,
        _R.CATALOG_CREDENTIALS_REFUSED,
        _R.KAFKA_CREDENTIALS_REFUSED,
        _R.REGISTRY_UNAVAILABLE,
        _R.LOCAL_DISK_FULL,
        _R.CLOCK_BEHIND,
        _R.EXECUTORS_LOST,
        _R.BAD_RECORD_HALTED,
        _R.DATA_LOSS_HALTED,
        _R.TABLE_CLAIMED,
        _R.SECRET_NOT_ALLOWED,
    },
    ConditionType.FRESHNESS_MET: _LIFECYCLE
    | {
        _R.WITHIN_TARGET,
        _R.BEHIND_TARGET,
        _R.NO_COMMITS_YET,
        _R.NOT_MEASURED,
    },
    ConditionType.DEGRADED: _LIFECYCLE
    | {
        _R.HEALTHY,
        _R.DATA_LOSS,
        _R.OFFSETS_AHEAD_OF_TOPIC,
        _R.TOPIC_RECREATED,
        _R.BAD_RECORD_HALTED,
        _R.DATA_LOSS_HALTED,
        _R.DEAD_LETTER_FAILED,
        _R.SCHEMA_CHANGE_REFUSED,
        _R.CATALOG_CREDENTIALS_REFUSED,
        _R.KAFKA_CREDENTIALS_REFUSED,
        _R.SECRET_NOT_ALLOWED,
        _R.DRIVER_FAILED,
        _R.COMPACTION_FAILED,
        _R.POD_POLICY_VIOLATION,
    },
    ConditionType.COMPACTING: _LIFECYCLE
    | {_R.COMPACTING, _R.NO_COMPACTION_NEEDED, _R.COMPACTION_FAILED, _R.UPKEEP_NOT_AVAILABLE},
}


class Condition(StatusModel):
    """One observation about the StreamingTable, in Kubernetes condition form."""

    type: ConditionType = Field(description="Condition type; one entry per type.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[ConditionReason, WithJsonSchema(_REASON_CRD_SCHEMA)] = Field(
        description=(
            "Machine-readable CamelCase reason for the status. This release sets "
            + ", ".join(r.value for r in ConditionReason)
            + f"; a newer release may add reasons (stored: any CamelCase word of up to {REASON_MAX_LENGTH} "
            "characters), so act on the condition's status, not only on reasons you know."
        )
    )
    message: str = Field(default="", description="Human-readable detail.", max_length=32768)
    last_transition_time: datetime = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )

    @model_validator(mode="after")
    def _reason_fits_type(self) -> Condition:
        if self.reason not in REASONS_BY_TYPE[self.type]:
            problems = ProblemCollector()
            allowed = ", ".join(sorted(r.value for r in REASONS_BY_TYPE[self.type]))
            problems.add(
                ("reason",),
                f"{self.reason.value} is not a reason for {self.type.value}; use one of {allowed}",
            )
            problems.raise_if_any()
        return self


class FreshnessStatus(StatusModel):
    """How far the table is behind the topic."""

    seconds: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Seconds between now and the newest record committed to the table; unset before the first commit."
        ),
    )
    lag_records: int = Field(
        default=0, ge=0, description="Records in Kafka not yet in the table, all partitions."
    )
    partition_lag: dict[int, int] = Field(
        default_factory=dict,
        description="Records not yet in the table, per Kafka partition (may list only the most lagging).",
    )
    last_commit_time: datetime | None = Field(
        default=None, description="When the last ingestion commit landed."
    )
    snapshot_id: int | None = Field(
        default=None, description="Iceberg snapshot id of the last ingestion commit."
    )


class TableStatus(StatusModel):
    """Shape of the Iceberg table, as seen at the last observation."""

    files: int = Field(default=0, ge=0, description="Data files in the current snapshot.")
    avg_file_size_bytes: int = Field(default=0, ge=0, description="Average data file size in bytes.")
    snapshots: int = Field(default=0, ge=0, description="Snapshots retained in table metadata.")
    records: int = Field(default=0, ge=0, description="Rows in the current snapshot.")
    small_file_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "Share of data files smaller than the compaction target size; unset when not measured (it needs "
            "the manifests, read only with the compaction planner)."
        ),
    )
    compaction_backlog: int | None = Field(
        default=None,
        ge=0,
        description="Compaction and maintenance work items waiting (what the compaction pods scale on).",
    )
    last_compaction_time: datetime | None = Field(
        default=None, description="When the newest retained rewrite (replace) snapshot was committed."
    )
    last_expiry_time: datetime | None = Field(
        default=None,
        description=(
            "When snapshots were last expired, from table property icefall.last-expiry-time-ms; unset when "
            "unknown (expiry leaves no snapshot behind, so only a maintenance run that records it tells)."
        ),
    )


#: The most partitions a driver's report lists (the most lagging ones).
REPORTED_PARTITIONS = 20
#: The most destination tables `status.tables` lists: every static destination (spec.table and up to 64
#: routes); past it (dynamic routes), spec.table and the most lagging ones. `status.tableCount` counts all.
MAX_STATUS_TABLES = 100


class DestinationStatus(StatusModel):
    """One table the StreamingTable writes (spec.table, a route's table or one its dynamic route made), as
    its driver measured it from the table's own committed offsets and snapshots."""

    table: str = Field(
        min_length=1, max_length=1024, description="The table's identifier: namespace levels, then its name."
    )
    lag_records: int | None = Field(
        default=None,
        ge=0,
        description="Records in Kafka past this table's own committed offsets; unset when not measured.",
    )
    freshness_seconds: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Seconds between now and the newest record this table holds; 0 when it holds all the topic had "
            "at the last batch; unset when not measured."
        ),
    )
    last_commit_time: datetime | None = Field(
        default=None, description="When the last ingestion commit of this table landed."
    )
    snapshot_id: int | None = Field(default=None, description="Iceberg snapshot id of that commit.")
    compaction_backlog: int | None = Field(
        default=None, ge=0, description="Compaction and maintenance work items waiting in this table."
    )
    table_uuid: str | None = Field(
        default=None,
        max_length=64,
        description="Iceberg's table-uuid of the table (deletionPolicy Delete drops only this one).",
    )


def _tables_field(what: str) -> Any:
    return Field(
        default_factory=list,
        max_length=MAX_STATUS_TABLES,
        description=(
            f"{what}: one entry per destination table, spec.table first (at most {MAX_STATUS_TABLES}: "
            "spec.table and the most lagging ones)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["table"]},
    )


class PartitionLag(StatusModel):
    """One partition's lag, as the driver measured it."""

    partition: int = Field(ge=0, description="The Kafka partition.")
    records: int = Field(ge=0, description="Its records not yet in the table.")


class WriterReport(StatusModel):
    """What the ingestion driver measured last, with the table's own credentials from its own pod. The
    operator reads no table and no topic itself (it would lend its network position and identity to
    whatever address a table names): these figures are what status, metrics and compaction scaling show."""

    reported_at: datetime = Field(description="When the driver measured these figures.")
    freshness_seconds: float = Field(
        ge=0, description="Seconds between then and the newest committed record; 0 when caught up."
    )
    lag_records: int = Field(ge=0, description="Records in Kafka not yet in the table then, all partitions.")
    partition_lag: list[PartitionLag] = Field(
        default_factory=list,
        max_length=REPORTED_PARTITIONS,
        description=(
            f"The lag per partition then, the {REPORTED_PARTITIONS} most lagging at most (a list: each "
            "report replaces it whole); empty when caught up or not measured."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["partition"]},
    )
    last_commit_time: datetime | None = Field(
        default=None, description="When the driver's last commit landed; unset before its first."
    )
    snapshot_id: int | None = Field(default=None, description="Iceberg snapshot id of that commit.")
    waiting_for: str | None = Field(
        default=None,
        max_length=32,
        description=(
            "A service the driver cannot reach and is waiting out (kafka, catalog, object_store, registry, "
            "kube_apiserver; local_disk: its local disk is full; clock: its clock is behind the table; "
            "executors: its Spark executors stopped answering); "
            "unset when it reaches them all."
        ),
    )
    lost_records: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Records Kafka's retention deleted before they were ingested, over the table's life (the "
            "table's icefall.lost-records), as of the driver's last commit or its last reading of the table, "
            "whichever says more; unset before either."
        ),
    )
    last_loss_time: datetime | None = Field(
        default=None,
        description="When a commit of the driver last skipped records retention had deleted; unset if never.",
    )
    schema_refused: list[Annotated[str, StringConstraints(max_length=1000)]] = Field(
        default_factory=list,
        max_length=20,
        description=(
            "Schema changes of the records that the table cannot follow (a type narrowed or changed), one "
            "per field with its fix; their records go to the dead-letter table when a value does not fit."
        ),
    )
    table_uuid: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "Iceberg's table-uuid of the table the driver writes, as its catalog gave it: the one table "
            "deletionPolicy Delete may drop (another table of that name, e.g. one created again, is kept)."
        ),
    )
    dead_letter_table_uuid: str | None = Field(
        default=None, max_length=64, description="The same for the dead-letter table."
    )
    tables: list[DestinationStatus] = _tables_field(
        "Lag, freshness and last commit of each table the driver writes, as it measured them"
    )
    dynamic_tables: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many tables the dynamic route (spec.dynamicRoute) has made, as the driver last read the "
            "catalog; unset without a dynamic route or before its first reading."
        ),
    )
    table: TableStatus | None = Field(
        default=None,
        description=(
            "The table's figures as the driver read them with its own credentials (at most every 30 s, the "
            "compaction backlog included): what status shows and compaction is scaled on."
        ),
    )


class StreamingTableStatus(StatusModel):
    """Observed state of a StreamingTable."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec the status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Current conditions, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    freshness: FreshnessStatus | None = Field(default=None, description="Freshness and lag of the table.")
    table: TableStatus | None = Field(default=None, description="Files and snapshots of the table.")
    data_loss_records: int = Field(
        default=0,
        ge=0,
        description="Records Kafka deleted (retention) before they could be ingested, over the table's life.",
    )
    writer: WriterReport | None = Field(
        default=None, description="What the ingestion driver measured last (it reports every ~10 s)."
    )
    tables: list[DestinationStatus] = _tables_field(
        "Lag, freshness and last commit of each table the StreamingTable writes (spec.table, spec.routes, "
        "spec.dynamicRoute)"
    )
    table_count: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many tables the StreamingTable writes (spec.table, its routes' tables and the tables its "
            "dynamic route made, as the driver last reported them)."
        ),
    )

    @model_validator(mode="after")
    def _one_condition_per_type(self) -> StreamingTableStatus:
        problems = ProblemCollector()
        seen: set[ConditionType] = set()
        for i, condition in enumerate(self.conditions):
            if condition.type in seen:
                problems.add(
                    ("conditions", i, "type"), f"a second {condition.type.value} condition; keep one per type"
                )
            seen.add(condition.type)
        problems.raise_if_any()
        return self

    def condition(self, condition_type: ConditionType) -> Condition | None:
        """The condition of the given type, if present."""
        return next((c for c in self.conditions if c.type is condition_type), None)
