"""What table maintenance a StreamingTable asks for: `spec.compaction` (file sizes, snapshot expiry, orphan
removal, how many compaction pods) and `spec.retention` (drop whole time partitions past an age).

Guarantees: values are in range, and `retention.field` names a column partitioned by a time transform
(`retention_problems`, checked by the spec). What maintenance then runs is planned in
`icefall.plan.maintenance`.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from icefall.api.base import FIELD_PATH_PATTERN, ApiModel, Loc, ProblemCollector
from icefall.api.table import TableSpec

DEFAULT_ORPHAN_MIN_AGE_SECONDS = 3 * 86400
MIN_ORPHAN_MIN_AGE_SECONDS = 3600
DEFAULT_MAX_SNAPSHOT_AGE_SECONDS = 5 * 86400
MAX_COMPACTION_REPLICAS = 100


class CompactionSpec(ApiModel):
    """Continuous compaction and table maintenance: rewrite small files, rewrite manifests, expire snapshots,
    remove orphan files, apply `spec.retention`. In a cluster a Deployment of stateless pods does it, scaled
    from the backlog between minReplicas and maxReplicas; `icefall run` does it in-process beside the batches.
    """

    enabled: bool = Field(
        default=True,
        description=(
            "Run compaction and maintenance (including retention). false: the table is left as written."
        ),
    )
    min_replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_COMPACTION_REPLICAS,
        description="Fewest compaction pods, even with nothing to do. 0: none while the table is tidy.",
    )
    max_replicas: int = Field(
        default=2,
        ge=0,
        le=MAX_COMPACTION_REPLICAS,
        description="Most compaction pods, whatever the backlog. At least minReplicas.",
    )
    target_file_size_bytes: int | None = Field(
        default=None,
        ge=1024,
        le=16 * 1024**3,
        description=(
            "Size of the data files compaction writes. Default: the table property "
            "write.target-file-size-bytes, else 128 MiB."
        ),
    )
    max_snapshot_age_seconds: int = Field(
        default=DEFAULT_MAX_SNAPSHOT_AGE_SECONDS,
        ge=0,
        le=10 * 365 * 86400,
        description=(
            "Snapshots older than this are expired (time travel reaches back this far). Branch and tag "
            "heads and the newest minSnapshotsToKeep are always kept."
        ),
    )
    min_snapshots_to_keep: int = Field(
        default=1,
        ge=1,
        le=100000,
        description="The newest snapshots of main kept whatever their age.",
    )
    orphan_min_age_seconds: int = Field(
        default=DEFAULT_ORPHAN_MIN_AGE_SECONDS,
        ge=MIN_ORPHAN_MIN_AGE_SECONDS,
        le=365 * 86400,
        description=(
            "Files no metadata references are deleted only once older than this (at least 3600): a write "
            "in flight has files no snapshot references yet."
        ),
    )
    rewrite_deleted_percent: int = Field(
        default=10,
        ge=1,
        le=100,
        description=(
            "Keyed tables (mode upsert or cdc): a data file is rewritten without its deleted rows (and its "
            "position delete files dropped) once this percentage of its rows is deleted."
        ),
    )
    embedded_interval_seconds: int = Field(
        default=30,
        ge=0,
        le=86400,
        description=(
            "icefall run only: least seconds between two in-process maintenance steps (one work item "
            "each, on a thread beside the ingestion batches). 0: one after another."
        ),
    )

    @field_validator("orphan_min_age_seconds", mode="before")
    @classmethod
    def _orphan_window(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool) and value < MIN_ORPHAN_MIN_AGE_SECONDS:
            raise ValueError(
                f"orphanMinAgeSeconds {value} is below {MIN_ORPHAN_MIN_AGE_SECONDS} (1 h): files of a write "
                "in flight are referenced by no snapshot yet and would be deleted; raise it to at least 3600"
            )
        return value

    @model_validator(mode="after")
    def _replica_range(self) -> CompactionSpec:
        problems = ProblemCollector()
        if self.min_replicas > self.max_replicas:
            problems.add(
                ("minReplicas",),
                f"{self.min_replicas} is more than maxReplicas ({self.max_replicas}); lower it or raise "
                "maxReplicas",
            )
        problems.raise_if_any()
        return self


class RetentionSpec(ApiModel):
    """Drop data older than maxAgeSeconds, by whole partitions of a time-partitioned column (metadata only:
    no data file is rewritten). A partition goes once all of its time range is older than the cut-off."""

    field: str = Field(
        description=(
            "A timestamp or date column that spec.table.partitioning partitions by hour, day, month or year."
        ),
        min_length=1,
        max_length=1024,
        pattern=FIELD_PATH_PATTERN,
    )
    max_age_seconds: int = Field(
        ge=3600,
        le=100 * 365 * 86400,
        description="Rows whose partition ends more than this many seconds ago are deleted.",
    )


def retention_problems(retention: RetentionSpec, table: TableSpec) -> list[tuple[Loc, str]]:
    """`retention.field` must be partitioned by a time transform; paths relative to `spec.retention`."""
    for part in table.partitioning:
        if part.field == retention.field and part.parsed_transform.name.is_time:
            return []
    same_column = [p.transform for p in table.partitioning if p.field == retention.field]
    if same_column:
        why = f"{retention.field!r} is partitioned by {same_column[0]}, not by time"
    else:
        why = f"{retention.field!r} is not in spec.table.partitioning"
    return [
        (
            ("field",),
            f"{why}; retention drops whole time partitions: add {{field: {retention.field}, transform: day}} "
            "(or hour, month, year) to spec.table.partitioning, or name a column partitioned that way",
        )
    ]
