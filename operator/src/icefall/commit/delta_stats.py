"""Delta's per-file statistics (PROTOCOL.md, "Per-file Statistics") from a Parquet file's footer: the
`stats` of an `add` action, so Delta Spark, delta-rs and Databricks skip files by a filter.

`delta_stats(footer, StatsColumns.of(metadata))` reads nothing but the footer (`pq.ParquetFile(...)
.metadata`): `numRecords`, and for the columns Delta indexes (the table's first
`delta.dataSkippingNumIndexedCols` leaf columns, default 32, partition columns not counted; or those
`delta.dataSkippingStatsColumns` names) `nullCount`, `minValues` and `maxValues`, merged across row
groups, keyed by the columns' physical names when the table maps names, structs as nested objects.

Guarantee: every bound written holds for every row of the file — a bound that is too tight makes a
reader skip a file holding matching rows (wrong results), so where the footer cannot prove a bound the
column's bound is left out (never guessed):
- a row group without statistics for the column (all-null row groups have no min/max and need none);
- floats and doubles (Parquet writers leave NaN out of min/max; Spark orders NaN above every number);
- booleans, binary, arrays, maps, variants (Delta keeps no min/max for them; arrays and maps get no
  `nullCount` either: the footer counts null elements, not null lists); INT96 timestamps;
- strings are cut to `STRING_PREFIX` characters as Delta Spark does: the min to its prefix, the max to its
  prefix (extended over characters at or above U+FFFD) plus U+FFFD, so it stays above every value that
  starts with the prefix (code point order, which is UTF-8 byte order); a value the footer cannot decode
  as UTF-8: left out;
- timestamps as ISO-8601 in milliseconds, UTC (`Z`; `timestamp_ntz` without a zone): the min truncated
  down, the max rounded UP to the next millisecond (Delta keeps milliseconds; a max cut down would be
  below a value with microseconds);
- a column of the table the file lacks (added after it): `nullCount` = `numRecords` (readers read it as
  null), no min/max.
Not written: `tightBounds` (readers take true when absent: the file has no deletion vector).
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Delta's defaults (`delta.dataSkippingNumIndexedCols`; Spark's `dataSkippingStringPrefixLength`).
NUM_INDEXED_COLS = 32
STRING_PREFIX = 32
NUM_INDEXED_COLS_KEY = "delta.dataSkippingNumIndexedCols"
STATS_COLUMNS_KEY = "delta.dataSkippingStatsColumns"
MAPPING_MODE_KEY = "delta.columnMapping.mode"
PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
#: Delta's tie-breaker: appended to a cut max string (Delta Spark's `truncateMaxStringAgg`).
TIE_BREAKER = "\ufffd"

_INTEGERS = frozenset({"byte", "short", "integer", "long"})
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_EPOCH = datetime.datetime(1970, 1, 1)
_PER_MS = {"milliseconds": 1, "microseconds": 1_000, "nanoseconds": 1_000_000}


@dataclass(frozen=True)
class StatsColumn:
    """One indexed leaf column: its path of physical names (the Parquet column and the stats' keys) and its
    Delta type (a primitive type's name, or "complex" for arrays, maps and variants: counted, not kept)."""

    path: tuple[str, ...]
    type: str


@dataclass(frozen=True)
class StatsColumns:
    """The leaf columns whose statistics a file's `add` carries, in the table's order."""

    columns: tuple[StatsColumn, ...]

    @classmethod
    def of(cls, metadata: Mapping[str, Any] | None) -> StatsColumns:
        """The indexed columns of a table with the Metadata action `metadata` (none without a schema, or
        when `delta.dataSkippingStatsColumns` or `delta.dataSkippingNumIndexedCols` does not parse)."""
        found = dict(metadata or {})
        configuration = found.get("configuration") or {}
        try:
            fields = json.loads(found.get("schemaString") or "{}").get("fields") or []
        except ValueError:
            return cls(())
        partitions = {str(c).lower() for c in found.get("partitionColumns") or []}
        data = [f for f in fields if str(f.get("name", "")).lower() not in partitions]
        mapped = str(configuration.get(MAPPING_MODE_KEY, "none")).lower() != "none"
        named = configuration.get(STATS_COLUMNS_KEY)
        if named is not None:
            wanted = parse_stats_columns(str(named))
            if wanted is None:
                return cls(())
            return cls(tuple(_named_leaves(data, wanted, (), mapped)))
        try:
            count = int(configuration.get(NUM_INDEXED_COLS_KEY, NUM_INDEXED_COLS))
        except ValueError:
            return cls(())
        leaves = list(_leaves(data, (), mapped))
        return cls(tuple(leaves if count < 0 else _first_leaves(data, count, mapped)))


def _physical(f: Mapping[str, Any], mapped: bool) -> str:
    name = str(f["name"])
    return str((f.get("metadata") or {}).get(PHYSICAL_NAME_KEY, name)) if mapped else name


def _struct_fields(kind: Any) -> list[Mapping[str, Any]] | None:
    """A struct type's fields (None: not a struct)."""
    if isinstance(kind, Mapping) and kind.get("type") == "struct":
        return list(kind.get("fields") or [])
    return None


def _type_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else "complex"


def _leaves(
    fields: Sequence[Mapping[str, Any]], parent: tuple[str, ...], mapped: bool
) -> Iterator[StatsColumn]:
    for f in fields:
        path = (*parent, _physical(f, mapped))
        kind = f.get("type")
        inner = _struct_fields(kind)
        if inner is not None:
            yield from _leaves(inner, path, mapped)
        else:
            yield StatsColumn(path, _type_name(kind))


def _first_leaves(fields: Sequence[Mapping[str, Any]], count: int, mapped: bool) -> list[StatsColumn]:
    """The first `count` leaves in schema order (Delta's `truncateSchema`: a struct counts its leaves)."""
    return list(_leaves(fields, (), mapped))[:count]


def _named_leaves(
    fields: Sequence[Mapping[str, Any]],
    wanted: Sequence[tuple[str, ...]],
    parent: tuple[str, ...],
    mapped: bool,
) -> Iterator[StatsColumn]:
    """The leaves `wanted` names (logical names, case-insensitive; a struct named: all its leaves), in
    schema order."""
    for f in fields:
        name = str(f["name"]).lower()
        rests = [w[1:] for w in wanted if w and w[0] == name]
        if not rests:
            continue
        path = (*parent, _physical(f, mapped))
        kind = f.get("type")
        inner = _struct_fields(kind)
        if any(not rest for rest in rests):  # named itself
            if inner is not None:
                yield from _leaves(inner, path, mapped)
            else:
                yield StatsColumn(path, _type_name(kind))
        elif inner is not None:
            yield from _named_leaves(inner, rests, path, mapped)


def parse_stats_columns(text: str) -> list[tuple[str, ...]] | None:
    """`delta.dataSkippingStatsColumns` (comma-separated, dotted for nested fields, `back-quoted` names
    with `` for a quote) as lower-case name paths; None when it does not parse."""
    columns: list[tuple[str, ...]] = []
    parts: list[str] = []
    name, quoted, i = "", False, 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "`" and text[i + 1 : i + 2] == "`":
                name, i = name + "`", i + 2
                continue
            quoted = ch != "`"
            name += ch if quoted else ""
        elif ch == "`":
            quoted = True
        elif ch in ".,":
            parts.append(name.strip())
            name = ""
            if ch == ",":
                columns.append(tuple(p.lower() for p in parts))
                parts = []
        else:
            name += ch
        i += 1
    if quoted:
        return None
    parts.append(name.strip())
    if text.strip():
        columns.append(tuple(p.lower() for p in parts))
    return None if any(not p for c in columns for p in c) else columns


# -- the footer ----------------------------------------------------------------------------------------


def delta_stats(footer: Any, columns: StatsColumns) -> str:
    """The `stats` JSON of the Parquet file whose footer is `footer` (`pyarrow.parquet.FileMetaData`)."""
    records = int(footer.num_rows)
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    paths = [footer.schema.column(j).path for j in range(footer.num_columns)]
    flat = {p: j for j, p in enumerate(paths) if footer.schema.column(j).max_repetition_level == 0}
    for column in columns.columns:
        if column.type == "complex" or any("." in name for name in column.path):
            continue  # arrays, maps, variants: no stats; a dotted name: its Parquet path is ambiguous
        found = flat.get(".".join(column.path))
        if found is None:
            if _absent(column.path, paths):
                _put(nulls, column.path, records)  # not in the file: null in every row
            continue
        merged = _merged(footer, found, column.type)
        if merged.nulls is not None:
            _put(nulls, column.path, merged.nulls)
        if merged.low is not None and merged.high is not None:
            _put(minimum, column.path, merged.low)
            _put(maximum, column.path, merged.high)
    stats: dict[str, Any] = {"numRecords": records}
    if minimum:
        stats |= {"minValues": minimum, "maxValues": maximum}
    if nulls:
        stats["nullCount"] = nulls
    return _json(stats)


def _absent(path: Sequence[str], paths: Sequence[str]) -> bool:
    """Whether no Parquet column of `paths` is the column `path`, in it or around it (names compared
    case-insensitively, as Spark's reader matches them)."""
    wanted = ".".join(path).lower()
    return not any(
        p == wanted or p.startswith(wanted + ".") or wanted.startswith(p + ".")
        for p in (q.lower() for q in paths)
    )


@dataclass(frozen=True)
class _Merged:
    nulls: int | None
    low: Any = None
    high: Any = None


def _merged(footer: Any, j: int, kind: str) -> _Merged:
    """Column `j`'s null count and Delta bounds across the row groups (None where one cannot be proven)."""
    described = footer.schema.column(j)
    logical = json.loads(described.logical_type.to_json())
    nulls: int | None = 0
    lows: list[Any] = []
    highs: list[Any] = []
    bounded = _bounds_possible(kind, described.physical_type, logical)
    for g in range(footer.num_row_groups):
        group = footer.row_group(g)
        if group.num_rows == 0:
            continue
        stats = group.column(j).statistics
        counted = stats is not None and stats.has_null_count
        if nulls is not None:
            nulls = nulls + int(stats.null_count) if counted else None
        if not bounded:
            continue
        if stats is not None and stats.has_min_max:
            lows.append(stats.min_raw if kind.startswith("timestamp") else stats.min)
            highs.append(stats.max_raw if kind.startswith("timestamp") else stats.max)
        elif not (counted and int(stats.null_count) == group.num_rows):
            bounded = False  # values without statistics: no bound
    if not bounded or not lows:
        return _Merged(nulls)
    try:
        low, high = (
            _delta_value(kind, min(lows), logical, up=False),
            _delta_value(kind, max(highs), logical, up=True),
        )
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return _Merged(nulls)
    return _Merged(nulls, low, high)


def _bounds_possible(kind: str, physical: str, logical: Mapping[str, Any]) -> bool:
    """Whether the footer's min/max of a column of Delta type `kind` can be Delta's bounds."""
    logical_type = logical.get("Type")
    if kind in _INTEGERS:
        signed = logical_type == "None" or (logical_type == "Int" and bool(logical.get("isSigned")))
        return physical in ("INT32", "INT64") and signed
    if kind == "string":
        return physical == "BYTE_ARRAY" and logical_type == "String"
    if kind == "date":
        return physical == "INT32" and logical_type == "Date"
    if kind in ("timestamp", "timestamp_ntz"):
        utc = kind == "timestamp"
        return (
            physical == "INT64"
            and logical_type == "Timestamp"
            and bool(logical.get("isAdjustedToUTC")) == utc
            and logical.get("timeUnit") in _PER_MS
        )
    if (match := _DECIMAL.fullmatch(kind)) is not None:
        return logical_type == "Decimal" and int(logical.get("scale", -1)) == int(match.group(2))
    return False  # float, double (NaN), boolean, binary, anything else


def _delta_value(kind: str, value: Any, logical: Mapping[str, Any], *, up: bool) -> Any:
    """A footer bound as Delta's stats hold it; `up`: it is a max (rounded or cut upwards)."""
    if kind in _INTEGERS:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(kind)
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise TypeError(kind)  # not decoded as UTF-8
        return max_prefix(value) if up else value[:STRING_PREFIX]
    if kind == "date":
        if not isinstance(value, datetime.date):
            raise TypeError(kind)
        return value.isoformat()
    if kind.startswith("timestamp"):
        return timestamp_text(int(value), str(logical["timeUnit"]), up=up, utc=kind == "timestamp")
    if not isinstance(value, decimal.Decimal) or not value.is_finite():
        raise TypeError(kind)
    return value


def max_prefix(value: str) -> str:
    """A string at least `value` that Delta keeps for it: `value` when short, else its first
    `STRING_PREFIX` characters, then those that follow at or above the tie-breaker, then the tie-breaker."""
    if len(value) <= STRING_PREFIX:
        return value
    end = STRING_PREFIX
    while end < len(value) and value[end] >= TIE_BREAKER:
        end += 1
    return value[:end] + TIE_BREAKER


def timestamp_text(raw: int, unit: str, *, up: bool, utc: bool = True) -> str:
    """A Parquet timestamp (`raw` in `unit` since the epoch) as Delta's stats hold it: ISO-8601 with
    milliseconds, `Z` when UTC; rounded down, or up when `up`. ValueError/OverflowError outside years
    1-9999."""
    per_ms = _PER_MS[unit]
    millis = -(-raw // per_ms) if up else raw // per_ms
    m = _EPOCH + datetime.timedelta(milliseconds=millis)
    text = f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
    return f"{text}.{m.microsecond // 1000:03d}" + ("Z" if utc else "")


def _put(target: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for name in path[:-1]:
        target = target.setdefault(name, {})
    target[path[-1]] = value


def _json(value: Any) -> str:
    """Compact JSON; decimals as exact JSON numbers (Delta writes them as numbers)."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(k)}:{_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return json.dumps(value, ensure_ascii=False)
