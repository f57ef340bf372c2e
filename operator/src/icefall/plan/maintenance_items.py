"""The words of table maintenance: the `MaintenancePolicy` a plan follows (built from the spec by
`icefall.plan.maintenance.policy_from_spec`) and the work items a plan is made of (`WorkItem`).

Plain frozen data; what each item does, and when it is planned, is told in `icefall.plan.maintenance`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from icefall.plan.table_view import PartitionValue

if TYPE_CHECKING:
    pass


MIB = 1024 * 1024
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"  # Iceberg's table property
DEFAULT_TARGET_FILE_SIZE = 128 * MIB  # Iceberg's default for that property
DEFAULT_MANIFEST_TARGET_SIZE = 8 * MIB  # Iceberg's commit.manifest.target-size-bytes default
MIN_ORPHAN_AGE_MS = HOUR_MS


class TimeTransform(StrEnum):
    """Iceberg time partition transforms; values count hours/days/months/years since 1970-01-01 UTC."""

    HOUR = "hour"
    DAY = "day"
    MONTH = "month"
    YEAR = "year"


@dataclass(frozen=True)
class RetentionPolicy:
    """Drop data older than `max_age_ms`, by whole partitions of `partition_field` (a time transform of
    `source_column`), from `spec.retention` (see `policy_from_spec`). A partition is
    dropped only once ALL of its range is older than the cut-off; rows in a partition that straddles the
    cut-off stay until the whole partition is old."""

    partition_field: str
    source_column: str
    transform: TimeTransform
    max_age_ms: int

    def __post_init__(self) -> None:
        if self.max_age_ms <= 0:
            raise ValueError(f"retention max_age_ms must be positive, got {self.max_age_ms}")


@dataclass(frozen=True)
class MaintenancePolicy:
    target_file_size_bytes: int | None = None  # None: the table's write.target-file-size-bytes, or 128 MiB
    small_file_ratio: float = 0.75  # a data file below ratio * target is "small"
    min_files_to_compact: int = 5  # small files a partition needs before it is compacted
    max_bytes_per_task: int = 1024 * MIB  # input bytes of one CompactPartition item
    snapshot_max_age_ms: int = 5 * DAY_MS
    snapshot_min_keep: int = 1  # newest snapshots of main always kept
    expire_batch: int = (
        20  # expirable snapshots that make expiry worth a commit (else: a tenth of the age late)
    )
    orphan_min_age_ms: int = 3 * DAY_MS  # never below MIN_ORPHAN_AGE_MS
    manifest_count_threshold: int = 100
    manifest_target_size_bytes: int = DEFAULT_MANIFEST_TARGET_SIZE
    deleted_fraction_threshold: float = 0.1  # a data file with this share of its rows deleted is rewritten
    max_delete_files_per_partition: int = 20  # position delete files that make a partition's deletes due
    retention: RetentionPolicy | None = None

    def __post_init__(self) -> None:
        if self.target_file_size_bytes is not None and self.target_file_size_bytes <= 0:
            raise ValueError(f"target_file_size_bytes must be positive, got {self.target_file_size_bytes}")
        if not 0 < self.small_file_ratio <= 1:
            raise ValueError(f"small_file_ratio must be in (0, 1], got {self.small_file_ratio}")
        if self.min_files_to_compact < 2:
            raise ValueError(f"min_files_to_compact must be >= 2, got {self.min_files_to_compact}")
        if self.max_bytes_per_task <= 0:
            raise ValueError(f"max_bytes_per_task must be positive, got {self.max_bytes_per_task}")
        if self.snapshot_max_age_ms < 0 or self.snapshot_min_keep < 1 or self.expire_batch < 1:
            raise ValueError("need snapshot_max_age_ms >= 0, snapshot_min_keep >= 1 and expire_batch >= 1")
        if self.orphan_min_age_ms < MIN_ORPHAN_AGE_MS:
            raise ValueError(
                f"orphan_min_age_ms must be at least {MIN_ORPHAN_AGE_MS} (1 h): an in-flight write's files "
                f"are referenced by nothing yet; got {self.orphan_min_age_ms}"
            )
        if self.manifest_count_threshold < 2 or self.manifest_target_size_bytes <= 0:
            raise ValueError("need manifest_count_threshold >= 2 and a positive manifest_target_size_bytes")
        if not 0 < self.deleted_fraction_threshold <= 1:
            raise ValueError(
                f"deleted_fraction_threshold must be in (0, 1], got {self.deleted_fraction_threshold}"
            )
        if self.max_delete_files_per_partition < 1:
            raise ValueError(
                f"max_delete_files_per_partition must be >= 1, got {self.max_delete_files_per_partition}"
            )

    def target_size(self, properties: Mapping[str, str]) -> int:
        """The target data file size: the policy's, else the table property, else 128 MiB."""
        if self.target_file_size_bytes is not None:
            return self.target_file_size_bytes
        raw = properties.get(TARGET_FILE_SIZE_PROPERTY)
        try:
            value = int(raw) if raw is not None else DEFAULT_TARGET_FILE_SIZE
        except ValueError:
            value = DEFAULT_TARGET_FILE_SIZE
        return value if value > 0 else DEFAULT_TARGET_FILE_SIZE


def time_partition_field_name(column: str, transform: TimeTransform) -> str:
    """The partition field name Icefall and Iceberg Java give `transform(column)`: `<column>_<transform>`."""
    return f"{column}_{transform.value}"


@dataclass(frozen=True)
class ApplyRetention:
    """Delete every row with `source_column < delete_before_ms`: exactly the listed partitions, whole, so
    the delete is metadata-only."""

    partition_field: str
    source_column: str
    delete_before_ms: int
    partitions: tuple[PartitionValue, ...]
    files: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class CompactPartition:
    """Rewrite `files` (all in `partition` of spec `spec_id`) into files of about `target_size_bytes`."""

    partition: PartitionValue
    files: tuple[str, ...]
    input_bytes: int
    target_size_bytes: int
    reason: str
    spec_id: int = 0
    step: int = 1  # which of the partition's groups this is (1-based), in the planner's order


@dataclass(frozen=True)
class RewriteManifests:
    manifests: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ExpireSnapshots:
    """Expire `expire_ids` (all older than `older_than_ms`); `keep_ids` must survive whatever the worker's
    tool decides, `retain_last` is the newest-of-main count kept. Table properties are untouched."""

    older_than_ms: int
    retain_last: int
    keep_ids: tuple[int, ...]
    expire_ids: tuple[int, ...]


@dataclass(frozen=True)
class RemoveOrphans:
    """Delete exactly `paths`: referenced by no metadata and last modified before `older_than_ms`."""

    older_than_ms: int
    paths: tuple[str, ...]


@dataclass(frozen=True)
class ApplyDeletes:
    """Rewrite `data_files` (all in `partition` of spec `spec_id`) without the rows their position deletes
    name, into files of about `target_size_bytes`, and drop the delete files left applying to no live data
    file. `delete_files`: the file-scoped ones the planner expects to go (the worker decides from the
    metadata it reads); `deleted_rows`: rows they delete."""

    partition: PartitionValue
    data_files: tuple[str, ...]
    delete_files: tuple[str, ...]
    input_bytes: int
    deleted_rows: int
    target_size_bytes: int
    reason: str
    spec_id: int = 0
    step: int = 1  # which of the partition's groups this is (1-based), in the planner's order


WorkItem = (
    ApplyRetention | CompactPartition | RewriteManifests | ExpireSnapshots | RemoveOrphans | ApplyDeletes
)
