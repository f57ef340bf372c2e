"""What maintenance planning reads: a `TableView`, a table's metadata summarised as plain data (the live
files of `main`'s head, every snapshot with the refs that point at it, the head's manifests, every path any
metadata still references, and a listing of the table's storage).

Plain frozen data, no I/O: `icefall.compact.view` fills it from pyiceberg, `icefall.plan.maintenance`
plans from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


STAGE_BRANCH_PREFIX = "icefall_stage_"
MAIN = "main"


class FileContent(StrEnum):
    DATA = "data"
    POSITION_DELETES = "position_deletes"
    EQUALITY_DELETES = "equality_deletes"


PartitionValue = tuple[object, ...]  # partition values in the spec's field order; () when unpartitioned


@dataclass(frozen=True)
class DataFileInfo:
    """One live file of `main`'s head (data or delete file). For a position delete file, `record_count` is
    the number of deleted rows and `referenced_data_file` the one data file they all name (None: several,
    or unknown). `sequence_number`: the data sequence number (a position delete applies to data files of
    its partition whose number is not greater than its own)."""

    path: str
    partition: PartitionValue
    size_bytes: int
    record_count: int
    added_snapshot_id: int
    content: FileContent = FileContent.DATA
    spec_id: int = 0
    referenced_data_file: str | None = None
    sequence_number: int = 0


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot in the table metadata. `refs`: names of the branches and tags whose head it is."""

    snapshot_id: int
    parent_id: int | None
    timestamp_ms: int
    is_on_main: bool  # an ancestor of (or equal to) main's head
    refs: tuple[str, ...] = ()

    @property
    def referenced_by_branch_or_tag(self) -> bool:
        return bool(self.refs)

    @property
    def is_main_head(self) -> bool:
        return MAIN in self.refs


@dataclass(frozen=True)
class ManifestInfo:
    """One manifest of `main`'s head."""

    path: str
    size_bytes: int
    added_files_count: int = 0
    existing_files_count: int = 0
    deleted_files_count: int = 0


@dataclass(frozen=True)
class StorageObject:
    """One object found by listing the table's location."""

    path: str
    size_bytes: int
    modified_ms: int


@dataclass(frozen=True)
class TableView:
    """The metadata the planner looks at. `referenced_paths`: every path any current metadata still
    reaches — data and delete files and manifests of every snapshot, manifest lists, metadata files in
    the metadata log, statistics files. `files` and `manifests` count as referenced too."""

    name: str
    snapshots: tuple[SnapshotInfo, ...] = ()
    files: tuple[DataFileInfo, ...] = ()
    manifests: tuple[ManifestInfo, ...] = ()
    referenced_paths: frozenset[str] = frozenset()
    storage: tuple[StorageObject, ...] = ()
    partition_fields: tuple[str, ...] = ()  # names of the default spec's partition fields, in order
    properties: Mapping[str, str] = field(default_factory=dict)
