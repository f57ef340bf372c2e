"""Route tables written from the driver (`icefall.ingest.arrow_append`), and when the driver may collect.

Proves, without Spark or a catalog: only unsorted tables whose every partition transform pyiceberg applies
as Spark does are written from the driver (a sort order, bucket or truncate keep the Spark append); the
rows Spark collects (every field nullable, columns in the query's order, the destination tag) are handed
to pyiceberg in the table's own Arrow schema; and the driver collects a batch's route rows only while its
estimated size is within `spec.batch.maxCollectBytes` (`plan.routing.driver_collects`), so its memory is
bounded by the setting, not by the backlog; the setting defaults to 64 MiB and 0 turns the collect off.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortField, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    IdentityTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
)
from pyiceberg.types import LongType, NestedField, StringType, StructType, TimestamptzType

from icefall.api import StreamingTable
from icefall.ingest.arrow_append import _as_table_rows, arrow_writable
from icefall.plan.routing import ROW_OVERHEAD_BYTES, VALUE_EXPANSION, collected_bytes, driver_collects

pytestmark = pytest.mark.unit

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "kind", StringType(), required=False),
    NestedField(3, "at", TimestamptzType(), required=False),
    NestedField(4, "inner", StructType(NestedField(5, "x", LongType(), required=True)), required=False),
)
MIB = 1024 * 1024


def table(
    spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC, order: SortOrder = UNSORTED_SORT_ORDER
) -> Table:
    """A table's metadata as pyiceberg holds it, with no catalog behind it (nothing here writes)."""
    metadata = new_table_metadata(SCHEMA, spec, order, "file:///nowhere/t")
    return Table(("lake", "t"), metadata, "file:///nowhere/t/metadata/1.json", load_file_io(), None)


def partitioned(source_id: int, transform: Transform[object, object]) -> PartitionSpec:
    return PartitionSpec(PartitionField(source_id=source_id, field_id=1000, transform=transform, name="p"))


@pytest.mark.parametrize(
    ("spec", "writable"),
    [
        (UNPARTITIONED_PARTITION_SPEC, True),
        (partitioned(2, IdentityTransform()), True),
        (partitioned(3, DayTransform()), True),
        (partitioned(2, VoidTransform()), True),
        (partitioned(1, BucketTransform(8)), False),
        (partitioned(2, TruncateTransform(4)), False),
    ],
    ids=["unpartitioned", "identity", "day", "void", "bucket", "truncate"],
)
def test_only_transforms_pyiceberg_applies_as_spark_does_are_written_from_the_driver(
    spec: PartitionSpec, writable: bool
) -> None:
    assert arrow_writable(table(spec)) is writable


def test_a_sorted_table_keeps_the_spark_append() -> None:
    order = SortOrder(SortField(source_id=1, transform=IdentityTransform()))
    assert not arrow_writable(table(order=order))
    assert arrow_writable(table())


def test_collected_rows_are_handed_over_in_the_tables_own_arrow_schema() -> None:
    # As Spark's toArrow gives them: every field nullable (nested ones too), the query's column order,
    # and the destination tag the union added.
    collected = pa.table(
        {
            "__icefall_destination": pa.array([3, 3], pa.int32()),
            "kind": ["a", None],
            "inner": pa.array([{"x": 1}, None], pa.struct([pa.field("x", pa.int64())])),
            "id": pa.array([7, 8], pa.int64()),
            "at": pa.array([0, 1], pa.timestamp("us", tz="UTC")),
        }
    )
    rows = _as_table_rows(table(), collected)
    assert rows.column_names == ["id", "kind", "at", "inner"]  # the tag is not a column of the table
    assert not rows.schema.field("id").nullable  # a required column stays required
    assert not rows.schema.field("inner").type.field("x").nullable
    assert rows.column("id").to_pylist() == [7, 8]
    assert rows.column("inner").to_pylist() == [{"x": 1}, None]


def test_rows_missing_a_column_of_the_table_are_refused_not_written() -> None:
    with pytest.raises(KeyError):
        _as_table_rows(table(), pa.table({"id": pa.array([1], pa.int64())}))


def test_the_estimate_counts_every_record_and_its_value_bytes() -> None:
    assert collected_bytes(0, 0) == 0
    assert collected_bytes(1000, 230_000) == 230_000 * VALUE_EXPANSION + 1000 * ROW_OVERHEAD_BYTES


def test_the_driver_collects_only_a_batch_within_the_limit() -> None:
    # The routing bench's batches (1,500 records of ~230 B) are far below the default.
    assert driver_collects(1500, 1500 * 230, 64 * MIB)
    # A backlog read in a batch of 1,000,000 such records (maxRecords' default) is not.
    assert not driver_collects(1_000_000, 230_000_000, 64 * MIB)
    limit = collected_bytes(10_000, 2_000_000)
    assert driver_collects(10_000, 2_000_000, limit)  # at the limit: collected
    assert not driver_collects(10_000, 2_000_001, limit)  # one byte past it: appended by Spark
    assert not driver_collects(10_001, 2_000_000, limit)


def test_a_limit_of_zero_never_collects_not_even_an_empty_batch() -> None:
    assert not driver_collects(0, 0, 0)
    assert driver_collects(0, 0, 1)


def test_the_limit_is_a_setting_of_the_batch_with_a_default_of_64_mib() -> None:
    manifest = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "events"},
        "spec": {
            "source": {"topic": "events", "bootstrapServers": "127.0.0.1:9092"},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long"}]},
        },
    }
    assert StreamingTable.model_validate(manifest).spec.batch.max_collect_bytes == 64 * MIB
    manifest["spec"]["batch"] = {"maxCollectBytes": 0}  # type: ignore[index]
    assert StreamingTable.model_validate(manifest).spec.batch.max_collect_bytes == 0
    manifest["spec"]["batch"] = {"maxCollectBytes": -1}  # type: ignore[index]
    with pytest.raises(ValueError, match="maxCollectBytes"):
        StreamingTable.model_validate(manifest)
