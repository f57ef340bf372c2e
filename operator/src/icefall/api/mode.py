"""A table's mode (`spec.mode`): what a record means for the table, and the rules of a keyed table's key
(`spec.key`) and of a cdc table's order of changes (`spec.sequenceBy`).

Guarantees: a keyed table's key columns are required top-level primitives of the inline schema (not float or
double: Iceberg refuses them as identifier fields), each once; `sequenceBy` paths name positions in the
Debezium envelope, each once and none inside another. With a registry schema the key is checked when the
pipeline starts (`icefall.catalog.tables`).
"""

from __future__ import annotations

import difflib
import re
from enum import StrEnum

from icefall.api.base import Loc
from icefall.api.format import Format


class TableMode(StrEnum):
    """What a record means for the table."""

    APPEND = "append"  # every record is a new row
    UPSERT = "upsert"  # a record replaces the row with its key; a tombstone (null value) deletes it
    CDC = "cdc"  # a Debezium change event (op c/r/u/d, before/after) changes the row with its key


#: How long a cdc table with sequenceBy remembers a deleted key by default (`rememberDeletesSeconds`).
DEFAULT_REMEMBER_DELETES_SECONDS = 3600
#: Types an identifier (key) field may have: Iceberg refuses float and double identifier fields, and
#: nested types cannot be compared for equality.
KEY_TYPES = frozenset(
    {"boolean", "int", "long", "decimal", "date", "time", "timestamp", "timestamptz", "string", "uuid",
     "fixed", "binary"}
)  # fmt: skip


def key_problems(mode: TableMode, key: list[str] | None, fmt: Format) -> list[tuple[Loc, str]]:
    """`key` against `mode` and the schema (`fmt`); paths relative to `spec`. With `transforms.select` the
    key is also checked against the selected columns when the pipeline starts (`icefall.catalog.tables`)."""
    if mode is TableMode.APPEND:
        if key is not None:
            return [(("key",), "a key applies to mode upsert or cdc; remove it or set mode")]
        return []
    if key is None:
        return [(("key",), f"mode {mode.value} needs the columns that identify a row, e.g. key: [id]")]
    if not fmt.schema_known:
        return []  # the columns come from the registry: checked when the pipeline starts
    problems: list[tuple[Loc, str]] = []
    fields = {f.name: f for f in fmt.schema_fields}
    seen: set[str] = set()
    for i, name in enumerate(key):
        field = fields.get(name)
        if name in seen:
            problems.append((("key", i), f"{name!r} is already in the key; remove one"))
        elif field is None:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((("key", i), f"{name!r} is not a top-level field of format.schema{hint}"))
        elif field.parsed.name not in KEY_TYPES:
            problems.append(
                (("key", i), f"{name!r} is a {field.parsed.name}; a key column is a primitive other than "
                 "float and double")
            )  # fmt: skip
        elif not field.required:
            problems.append(
                (("key", i), f"{name!r} may be null; a key column must be set: add required: true to it")
            )
        seen.add(name)
    return problems


#: A path into a Debezium envelope: dotted field names.
SEQUENCE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: Envelope fields that hold the row or the operation, not a position.
NOT_POSITIONS = ("op", "before", "after", "payload", "schema")


def sequence_problems(
    mode: TableMode, sequence_by: list[str] | None, remember_deletes_seconds: int | None
) -> list[tuple[Loc, str]]:
    """`sequenceBy` against `mode`: paths into the Debezium envelope; paths relative to `spec`."""
    if sequence_by is None:
        if remember_deletes_seconds is not None:
            return [(("rememberDeletesSeconds",), "applies with sequenceBy (mode cdc); remove it")]
        return []
    if mode is not TableMode.CDC:
        return [
            (
                ("sequenceBy",),
                "sequenceBy orders Debezium change events by their source position; it applies to mode "
                "cdc: remove it, or set mode: cdc",
            )
        ]
    problems: list[tuple[Loc, str]] = []
    for i, path in enumerate(sequence_by):
        if not SEQUENCE_PATH.match(path):
            problems.append(
                (("sequenceBy", i), f"{path!r} is not a path of field names, e.g. source.lsn or ts_ms")
            )
        elif path.split(".")[0] in NOT_POSITIONS:
            problems.append(
                (
                    ("sequenceBy", i),
                    f"{path!r} is not a position of the change: name a field of the envelope's source "
                    "block (e.g. source.lsn; paths are inside payload when the schema envelope is on)",
                )
            )
        elif path in sequence_by[:i]:
            problems.append((("sequenceBy", i), f"{path!r} is already in sequenceBy; remove one"))
        elif any(other.startswith(f"{path}.") or path.startswith(f"{other}.") for other in sequence_by):
            problems.append((("sequenceBy", i), f"{path!r} holds, or is inside, another entry; keep one"))
    return problems
