"""Delta per-file statistics from a Parquet footer (`icefall.commit.delta_stats`), and the `add` actions
that carry them (a batch's `moved_into`, a compaction pod's merge), without Spark.

Proves: numbers, decimals, dates, strings and timestamps become Delta's JSON values, merged across row
groups; nulls are counted per leaf (a null struct counts for its fields) and an all-null column or row
group has a count but no bound; nested structs nest; long strings are cut to 32 characters with a max
that stays above every value (the U+FFFD tie-breaker, extended over characters above it); a timestamp
max with microseconds rounds UP to the next millisecond; floats, booleans, binary, arrays and maps get
no bounds; a row group without statistics drops the column's bounds (never a guess); a column the file
lacks counts every row null; only the first `delta.dataSkippingNumIndexedCols` leaves (partition
columns not counted) or the `delta.dataSkippingStatsColumns` are kept; keys are physical names when the
table maps names. Every bound holds for every row of the file (checked against the rows themselves).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefall.commit.batch import Batch
from icefall.commit.delta import DeltaLog, commit_batch, create_table, moved_into
from icefall.commit.delta_files import LogFiles
from icefall.commit.delta_stats import (
    STRING_PREFIX,
    TIE_BREAKER,
    StatsColumns,
    delta_stats,
    max_prefix,
    parse_stats_columns,
    timestamp_text,
)
from icefall.compact.delta_pods import merge
from icefall.compact.worker import Outcome
from icefall.plan.delta_maintenance import CompactFiles

pytestmark = pytest.mark.unit


def field(name: str, kind: Any, physical: str | None = None) -> dict[str, Any]:
    metadata = {"delta.columnMapping.physicalName": physical} if physical else {}
    return {"name": name, "type": kind, "nullable": True, "metadata": metadata}


def struct(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": list(fields)}


def metadata_of(*fields: dict[str, Any], partitions: tuple[str, ...] = (), **conf: str) -> dict[str, Any]:
    return {
        "schemaString": json.dumps(struct(*fields)),
        "partitionColumns": list(partitions),
        "configuration": dict(conf),
    }


def stats_of(tmp_path: Path, table: pa.Table, metadata: dict[str, Any], **write: Any) -> dict[str, Any]:
    path = tmp_path / f"f{len(list(tmp_path.iterdir()))}.parquet"
    pq.write_table(table, path, **write)
    text = delta_stats(pq.read_metadata(path), StatsColumns.of(metadata))
    parsed: dict[str, Any] = json.loads(text, parse_float=Decimal)
    return parsed


def test_values_of_each_type_merged_across_row_groups(tmp_path: Path) -> None:
    table = pa.table(
        {
            "i": pa.array([3, None, -7, 12], pa.int32()),
            "l": pa.array([2**40, 5, None, -(2**40)], pa.int64()),
            "b": pa.array([1, 2, 3, 4], pa.int8()),
            "d": pa.array([Decimal("1.25"), Decimal("-3.50"), None, Decimal("10.00")], pa.decimal128(10, 2)),
            "big": pa.array([Decimal("123456789012345678901234.5")] * 4, pa.decimal128(30, 1)),
            "day": pa.array([date(2024, 1, 2), date(1999, 12, 31), None, date(2030, 6, 1)]),
            "s": ["b", "a", None, "zz"],
        }
    )
    metadata = metadata_of(
        field("i", "integer"),
        field("l", "long"),
        field("b", "byte"),
        field("d", "decimal(10,2)"),
        field("big", "decimal(30,1)"),
        field("day", "date"),
        field("s", "string"),
    )
    stats = stats_of(tmp_path, table, metadata, row_group_size=2, store_decimal_as_integer=True)
    assert stats["numRecords"] == 4
    assert stats["minValues"] == {
        "i": -7,
        "l": -(2**40),
        "b": 1,
        "d": Decimal("-3.50"),
        "big": Decimal("123456789012345678901234.5"),
        "day": "1999-12-31",
        "s": "a",
    }
    assert stats["maxValues"] == {
        "i": 12,
        "l": 2**40,
        "b": 4,
        "d": Decimal("10.00"),
        "big": Decimal("123456789012345678901234.5"),
        "day": "2030-06-01",
        "s": "zz",
    }
    assert stats["nullCount"] == {"i": 1, "l": 1, "b": 0, "d": 1, "big": 0, "day": 1, "s": 1}


def test_decimals_are_exact_json_numbers(tmp_path: Path) -> None:
    table = pa.table({"d": pa.array([Decimal("0.10"), Decimal("99999999.99")], pa.decimal128(10, 2))})
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    text = delta_stats(pq.read_metadata(path), StatsColumns.of(metadata_of(field("d", "decimal(10,2)"))))
    assert '"minValues":{"d":0.10}' in text and '"maxValues":{"d":99999999.99}' in text


def test_all_null_columns_and_row_groups_count_nulls_without_bounds(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array([None, None, 5, 9], pa.int64()), "n": pa.array([None] * 4, pa.int64())})
    stats = stats_of(tmp_path, table, metadata_of(field("a", "long"), field("n", "long")), row_group_size=2)
    assert stats["minValues"] == {"a": 5} and stats["maxValues"] == {"a": 9}  # the null row group needs none
    assert stats["nullCount"] == {"a": 2, "n": 4}


def test_nested_structs_nest_and_a_null_struct_counts_for_its_fields(tmp_path: Path) -> None:
    rows = [{"x": 1, "inner": {"y": "q"}}, None, {"x": None, "inner": {"y": "r"}}]
    table = pa.table({"st": pa.array(rows), "id": [1, 2, 3]})
    inner = struct(field("y", "string"))
    metadata = metadata_of(
        field("st", struct(field("x", "long"), field("inner", inner))), field("id", "long")
    )
    stats = stats_of(tmp_path, table, metadata)
    assert stats["minValues"] == {"st": {"x": 1, "inner": {"y": "q"}}, "id": 1}
    assert stats["maxValues"] == {"st": {"x": 1, "inner": {"y": "r"}}, "id": 3}
    assert stats["nullCount"] == {"st": {"x": 2, "inner": {"y": 1}}, "id": 0}


def test_types_without_bounds_keep_their_null_count_only(tmp_path: Path) -> None:
    table = pa.table(
        {
            "f": pa.array([1.0, float("nan"), None], pa.float64()),  # the footer leaves NaN out of its max
            "r": pa.array([1.5, 2.5, 3.5], pa.float32()),
            "ok": [True, None, False],
            "bin": pa.array([b"\x00", b"\xff", None]),
            "arr": pa.array([[1, 2], None, []]),
            "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        }
    )
    metadata = metadata_of(
        field("f", "double"),
        field("r", "float"),
        field("ok", "boolean"),
        field("bin", "binary"),
        field("arr", {"type": "array", "elementType": "long", "containsNull": True}),
        field("m", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
    )
    stats = stats_of(tmp_path, table, metadata)
    assert "minValues" not in stats and "maxValues" not in stats
    assert stats["nullCount"] == {"f": 1, "r": 0, "ok": 1, "bin": 1}  # arrays, maps: the footer cannot tell


def test_long_strings_are_cut_with_a_max_above_every_value(tmp_path: Path) -> None:
    long_low, long_high = "a" * 40, "m" * 31 + "xyz" + "q" * 10
    table = pa.table({"s": [long_low, long_high, "b"]})
    stats = stats_of(tmp_path, table, metadata_of(field("s", "string")))
    assert stats["minValues"]["s"] == "a" * STRING_PREFIX
    assert stats["maxValues"]["s"] == "m" * 31 + "x" + TIE_BREAKER
    assert stats["maxValues"]["s"] > long_high and stats["minValues"]["s"] <= long_low


def test_a_cut_max_extends_over_characters_at_or_above_the_tie_breaker() -> None:
    assert max_prefix("short") == "short"
    assert max_prefix("a" * STRING_PREFIX) == "a" * STRING_PREFIX
    over = "a" * 32 + "\uffff\U0001f600b" + "c" * 5
    cut = max_prefix(over)
    assert cut == "a" * 32 + "\uffff\U0001f600" + TIE_BREAKER
    assert cut > over and cut.encode() > over.encode()  # code point order is UTF-8 byte order
    for value in ["z" * 33, "a" * 32 + "\U0001f600", "a" * 31 + "\ufffd" * 3 + "x"]:
        assert max_prefix(value) >= value


def test_timestamps_in_milliseconds_utc_the_max_rounded_up(tmp_path: Path) -> None:
    stamps = [
        datetime(2026, 11, 29, 8, 0, 0, 123456, tzinfo=UTC),
        datetime(2026, 11, 29, 9, 30, 1, 5000, tzinfo=UTC),
    ]
    table = pa.table(
        {
            "ts": pa.array(stamps, pa.timestamp("us", tz="UTC")),
            "ntz": pa.array([s.replace(tzinfo=None) for s in stamps], pa.timestamp("us")),
        }
    )
    metadata = metadata_of(field("ts", "timestamp"), field("ntz", "timestamp_ntz"))
    stats = stats_of(tmp_path, table, metadata)
    assert stats["minValues"] == {"ts": "2026-11-29T08:00:00.123Z", "ntz": "2026-11-29T08:00:00.123"}
    assert stats["maxValues"] == {"ts": "2026-11-29T09:30:01.005Z", "ntz": "2026-11-29T09:30:01.005"}
    # a max with microseconds past the millisecond: the next millisecond, never below the value
    assert timestamp_text(1_000_001, "microseconds", up=True) == "1970-01-01T00:00:01.001Z"
    assert timestamp_text(1_000_001, "microseconds", up=False) == "1970-01-01T00:00:01.000Z"
    assert timestamp_text(-1, "microseconds", up=False) == "1969-12-31T23:59:59.999Z"
    assert timestamp_text(-1, "microseconds", up=True) == "1970-01-01T00:00:00.000Z"
    assert timestamp_text(5, "nanoseconds", up=True, utc=False) == "1970-01-01T00:00:00.001"


def test_int96_timestamps_and_a_type_the_file_does_not_hold_get_no_bounds(tmp_path: Path) -> None:
    table = pa.table({"ts": pa.array([1, 2], pa.timestamp("us", tz="UTC")), "n": pa.array(["1", "2"])})
    metadata = metadata_of(field("ts", "timestamp"), field("n", "long"))
    stats = stats_of(tmp_path, table, metadata, use_deprecated_int96_timestamps=True)
    assert "minValues" not in stats
    assert stats["nullCount"] == {"n": 0}  # INT96 has no statistics at all: no null count either


class WithoutStatistics:
    """A real footer whose row group `group` shows no statistics (as a writer that wrote none there):
    Parquet writers set statistics per file, so a file mixing both is made by hiding them."""

    def __init__(self, footer: Any, group: int) -> None:
        self._footer, self._group = footer, group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._footer, name)

    def row_group(self, g: int) -> Any:
        found = self._footer.row_group(g)
        return _Hidden(found) if g == self._group else found


class _Hidden:
    def __init__(self, group: Any) -> None:
        self.num_rows = group.num_rows
        self._group = group

    def column(self, j: int) -> Any:
        return _NoStats()


class _NoStats:
    statistics = None


def test_a_row_group_without_statistics_drops_the_bounds(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array([1, 2, 3, 4], pa.int64()), "b": pa.array([1, 2, 3, 4], pa.int64())})
    metadata = metadata_of(field("a", "long"), field("b", "long"))
    stats = stats_of(tmp_path, table, metadata, write_statistics=["b"])
    assert stats["minValues"] == {"b": 1} and stats["nullCount"] == {"b": 0}
    path = tmp_path / "groups.parquet"
    pq.write_table(table, path, row_group_size=2)
    hidden = WithoutStatistics(pq.read_metadata(path), 1)
    assert json.loads(delta_stats(hidden, StatsColumns.of(metadata))) == {"numRecords": 4}


def test_a_column_the_file_lacks_is_null_in_every_row(tmp_path: Path) -> None:
    table = pa.table({"id": [1, 2, 3]})
    metadata = metadata_of(
        field("id", "long"), field("added_later", "string"), field("later", struct(field("x", "long")))
    )
    stats = stats_of(tmp_path, table, metadata)
    assert stats["nullCount"] == {"id": 0, "added_later": 3, "later": {"x": 3}}
    assert stats["minValues"] == {"id": 1}


def test_only_the_first_indexed_columns_partition_columns_not_counted(tmp_path: Path) -> None:
    table = pa.table({"a": [1], "s": pa.array([{"x": 2, "y": 3}]), "c": [4]})
    fields = (
        field("day", "date"),
        field("a", "long"),
        field("s", struct(field("x", "long"), field("y", "long"))),
        field("c", "long"),
    )
    default = stats_of(tmp_path, table, metadata_of(*fields, partitions=("day",)))
    assert default["minValues"] == {"a": 1, "s": {"x": 2, "y": 3}, "c": 4}
    two = stats_of(
        tmp_path,
        table,
        metadata_of(*fields, partitions=("day",), **{"delta.dataSkippingNumIndexedCols": "2"}),
    )
    assert two["minValues"] == {"a": 1, "s": {"x": 2}} and two["nullCount"] == {"a": 0, "s": {"x": 0}}
    none = stats_of(tmp_path, table, metadata_of(*fields, **{"delta.dataSkippingNumIndexedCols": "0"}))
    assert none == {"numRecords": 1}
    every = stats_of(tmp_path, table, metadata_of(*fields, **{"delta.dataSkippingNumIndexedCols": "-1"}))
    assert every["maxValues"] == {"a": 1, "s": {"x": 2, "y": 3}, "c": 4}
    assert every["nullCount"]["day"] == 1  # not a partition column here, and not in the file


def test_stats_columns_name_the_kept_columns(tmp_path: Path) -> None:
    table = pa.table({"a": [1], "s": pa.array([{"x": 2, "y": 3}]), "c": [4]})
    fields = (
        field("a", "long"),
        field("s", struct(field("x", "long"), field("y", "long"))),
        field("c", "long"),
    )
    named = stats_of(tmp_path, table, metadata_of(*fields, **{"delta.dataSkippingStatsColumns": "C, `S`.y"}))
    assert named["minValues"] == {"s": {"y": 3}, "c": 4}
    whole = stats_of(tmp_path, table, metadata_of(*fields, **{"delta.dataSkippingStatsColumns": "s"}))
    assert whole["minValues"] == {"s": {"x": 2, "y": 3}}
    assert parse_stats_columns("a, `b.c`.d,`e``f`") == [("a",), ("b.c", "d"), ("e`f",)]
    assert parse_stats_columns("") == [] and parse_stats_columns("a,,b") is None
    assert parse_stats_columns("`open") is None
    broken = stats_of(tmp_path, table, metadata_of(*fields, **{"delta.dataSkippingStatsColumns": "a,,"}))
    assert broken == {"numRecords": 1}


def test_column_mapping_keys_by_physical_names(tmp_path: Path) -> None:
    table = pa.table({"col-1": [5, 7], "col-2": pa.array([{"col-3": "k"}, None])})
    fields = (
        field("Id", "long", "col-1"),
        field("nested", struct(field("name", "string", "col-3")), "col-2"),
    )
    mapped = metadata_of(*fields, **{"delta.columnMapping.mode": "name"})
    stats = stats_of(tmp_path, table, mapped)
    assert stats["minValues"] == {"col-1": 5, "col-2": {"col-3": "k"}}
    assert stats["nullCount"] == {"col-1": 0, "col-2": {"col-3": 1}}
    named = {
        **mapped,
        "configuration": {**mapped["configuration"], "delta.dataSkippingStatsColumns": "nested.NAME"},
    }
    assert stats_of(tmp_path, table, named)["maxValues"] == {"col-2": {"col-3": "k"}}


def test_no_schema_means_numrecords_only(tmp_path: Path) -> None:
    table = pa.table({"a": [1, 2]})
    assert stats_of(tmp_path, table, {}) == {"numRecords": 2}
    assert StatsColumns.of(None).columns == ()


def test_every_bound_holds_for_every_row(tmp_path: Path) -> None:
    import random

    rng = random.Random(42)
    alphabet = "aAz\u00e9\uffef\ufffd\uffff\U0001f600"
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 45))) for _ in range(400)]
    micros = [rng.randrange(-(10**15), 10**15) for _ in range(400)]
    table = pa.table({"s": values, "ts": pa.array(micros, pa.timestamp("us", tz="UTC"))})
    stats = stats_of(
        tmp_path, table, metadata_of(field("s", "string"), field("ts", "timestamp")), row_group_size=37
    )
    low, high = stats["minValues"]["s"], stats["maxValues"]["s"]
    assert all(low <= v <= high for v in values)
    as_text = [timestamp_text(m, "microseconds", up=False) for m in micros]  # the values' own milliseconds
    assert stats["minValues"]["ts"] <= min(as_text) and stats["maxValues"]["ts"] >= max(
        timestamp_text(m, "microseconds", up=True) for m in micros
    )


def test_a_batch_and_a_merge_write_the_statistics(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path / "t"))
    schema = struct(field("id", "long"), field("name", "string"))
    create_table(log, json.dumps(schema), epoch=1)
    for n in range(2):
        staging = tmp_path / f"staging{n}"
        staging.mkdir()
        rows = pa.table({"id": pa.array([10 * n, 10 * n + 5], pa.int64()), "name": [f"n{n}", None]})
        pq.write_table(rows, staging / f"part-0000{n}-x.snappy.parquet")
        snapshot = log.snapshot()
        files = moved_into(staging, log, snapshot.metadata)
        batch = Batch(topic="t", start={0: 2 * n}, end={0: 2 * n + 2}, topic_id="tid", max_produce_time_ms=1)
        commit_batch(log, snapshot, batch, 1, files)
    adds = [a["add"] for v in (1, 2) for a in log.actions(v) if "add" in a]
    first = json.loads(adds[0]["stats"])
    assert first == {
        "numRecords": 2,
        "minValues": {"id": 0, "name": "n0"},
        "maxValues": {"id": 5, "name": "n0"},
        "nullCount": {"id": 0, "name": 1},
    }
    files = LogFiles.read(log)
    result = merge(log, files, CompactFiles("", tuple(sorted(files.live)), 0))
    assert result.outcome is Outcome.DONE
    [merged] = [a["add"] for a in log.actions(log.latest_version()) if "add" in a]
    assert json.loads(merged["stats"]) == {
        "numRecords": 4,
        "minValues": {"id": 0, "name": "n0"},
        "maxValues": {"id": 15, "name": "n1"},
        "nullCount": {"id": 0, "name": 2},
    }
