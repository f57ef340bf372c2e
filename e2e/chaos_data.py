"""Edge-case records for the chaos run, and a reference decoder that owes nothing to the ingestion code.

`records(rng, start, count)` makes a mix of good records (plain, unicode, extreme numbers and timestamps,
large values, nulls, trailing text) and one of every malformed kind (see `BAD_KINDS`), each with the kind
it is. `expected(value)` decodes one Kafka value with the rules `SCHEMA` states, written here from the
documented JSON mapping (`icefall.decode.decode`'s module doc), with `json` and `decimal` only: either the
row the table must hold (column → value, as pyiceberg reads it back) or `BAD` (it belongs in the
dead-letter table). The chaos run's audit compares the tables with it, record by record.

Not covered: NaN/Infinity (not JSON), lone surrogates (`"\\ud800"`), nested structs and maps, and
schema evolution; the rounding of decimals with more fraction digits than the scale.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import Any

#: spec.format.schema of the chaos table (what `expected` implements).
SCHEMA: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "big", "type": "long"},
    {"name": "small", "type": "int"},
    {"name": "amount", "type": "decimal(38,10)"},
    {"name": "ratio", "type": "double"},
    {"name": "flag", "type": "boolean"},
    {"name": "tags", "type": "list", "element": {"type": "string"}},
    {"name": "payload", "type": "string"},
    {"name": "ts", "type": "timestamptz", "required": True},
]
COLUMNS = tuple(f["name"] for f in SCHEMA)
#: spec.deadLetter.maxRecordBytes of the chaos table: larger values are dead letters, not decoded.
MAX_RECORD_BYTES = 512 * 1024
#: The broker's default limit is ~1 MiB per record batch: every value stays well under it.
LARGE_GOOD_BYTES = (100 * 1024, 400 * 1024)
OVERSIZED_BYTES = 700 * 1024
PRECISION, SCALE = 38, 10
NOW = "2026-11-22T10:00:00Z"  # most records' ts: one day partition collects the small files compaction wants

BAD = object()  # `expected` for a record that belongs in the dead-letter table

UNICODE_NAMES = (
    "🧊🔥 ice-fall",  # astral plane (surrogate pairs when escaped)
    "e\u0301le\u0300ve",  # combining accents
    "👩\u200d👩\u200d👧\u200d👦 family",  # zero-width joiners
    "日本語テキスト",
    "مرحبا بالعالم",  # right to left
    "\u0000nul inside",  # an escaped NUL
    'tab\tnew\nline \\ quote" slash/',
    "\U0001d518\U0001d52b\U0001d526 \U0010fffd",  # mathematical letters; the last plane
    "",
)
EXTREME_TIMESTAMPS: tuple[Any, ...] = (
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "1970-01-01T00:00:00Z",
    "1969-12-31T23:59:59.999999Z",
    "2024-02-29T12:00:00+14:00",
    "2024-02-29T12:00:00.123456-12:00",
    "2026-11-22T10:00:00",  # no offset: UTC
    0,
    253402300799,  # epoch seconds: 9999-12-31T23:59:59Z
    -62135596800,  # 0001-01-01T00:00:00Z
)
EXTREME_LONGS = (2**63 - 1, -(2**63), 0, -1)
EXTREME_INTS = (2**31 - 1, -(2**31))
EXTREME_DECIMALS = (
    "9999999999999999999999999999.9999999999",
    "-9999999999999999999999999999.9999999999",
    "0.0000000001",
    "-0.0000000001",
    "0",
    "12345678901234567890",
)
EXTREME_DOUBLES = (
    1.7976931348623157e308,
    -1.7976931348623157e308,
    5e-324,
    2.2250738585072014e-308,
    -0.0,
    1e-300,
)

GOOD_KINDS = ("plain", "unicode", "extreme-numbers", "extreme-timestamp", "large", "nulls", "trailing-text")
#: Every malformed kind the dead-letter table must receive (each produced at least once per round).
BAD_KINDS = (
    "tombstone",
    "empty",
    "whitespace",
    "invalid-json",
    "truncated-json",
    "not-an-object",
    "json-null",
    "not-utf8",
    "not-utf8-in-string",
    "oversized",
    "missing-required",
    "null-required",
    "wrong-type-long",
    "wrong-type-boolean",
    "wrong-type-double",
    "wrong-type-list",
    "int-overflow",
    "long-overflow",
    "decimal-overflow",
    "bad-timestamp",
)


@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes | None
    kind: str


def _good(rng: random.Random, i: int, kind: str) -> bytes:
    row: dict[str, Any] = {
        "id": i,
        "name": f"n{i}",
        "big": rng.randint(-(10**12), 10**12),
        "small": rng.randint(-1000, 1000),
        "amount": Decimal(rng.randint(-(10**8), 10**8)) / 100,
        "ratio": rng.random(),
        "flag": rng.random() < 0.5,
        "tags": [f"t{rng.randint(0, 9)}"],
        "ts": NOW,
    }
    if kind == "unicode":
        row["name"] = rng.choice(UNICODE_NAMES)
        row["tags"] = [rng.choice(UNICODE_NAMES), rng.choice(UNICODE_NAMES)]
    elif kind == "extreme-numbers":
        row["big"] = rng.choice(EXTREME_LONGS)
        row["small"] = rng.choice(EXTREME_INTS)
        row["amount"] = Decimal(rng.choice(EXTREME_DECIMALS))
        row["ratio"] = rng.choice(EXTREME_DOUBLES)
        if rng.random() < 0.3:
            row["amount"] = str(row["amount"])  # a numeric string fits a decimal
    elif kind == "extreme-timestamp":
        row["ts"] = rng.choice(EXTREME_TIMESTAMPS)
    elif kind == "large":
        row["payload"] = "x" * rng.randint(*LARGE_GOOD_BYTES)
    elif kind == "nulls":
        for name in ("name", "big", "small", "amount", "ratio", "flag", "tags"):
            if rng.random() < 0.5:
                row[name] = None
            elif rng.random() < 0.5:
                del row[name]
        if "tags" in row and row["tags"] is not None:
            row["tags"] = rng.choice([[], ["a", None], [None]])
    text = _dumps(row, ascii_only=rng.random() < 0.5)
    if kind == "trailing-text":
        text += ' trailing {"id": -1}'
    return text.encode()


def _dumps(row: dict[str, Any], *, ascii_only: bool) -> str:
    # json cannot write a Decimal as a number: write it as a float placeholder, then put its digits back.
    numbers: dict[str, str] = {}

    def swap(value: Any) -> Any:
        if isinstance(value, Decimal):
            token = f"__num{len(numbers)}__"
            numbers[token] = str(value)
            return token
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    text = json.dumps(swap(row), ensure_ascii=ascii_only)
    for token, digits in numbers.items():
        text = text.replace(f'"{token}"', digits)
    return text


def _bad(rng: random.Random, i: int, kind: str) -> bytes | None:
    base: dict[str, Any] = {"id": i, "name": f"bad{i}", "ts": NOW}
    match kind:
        case "tombstone":
            return None
        case "empty":
            return b""
        case "whitespace":
            return b" \n\t "
        case "invalid-json":
            return rng.choice([b"{not json", b"{id: 1}", b"nope", b'{"id": 1,, "ts": "x"}'])
        case "truncated-json":
            return json.dumps(base).encode()[:-5]
        case "not-an-object":
            return rng.choice([b"[1, 2]", b"42", b'"text"', b"true"])
        case "json-null":
            return b"null"
        case "not-utf8":
            return b"\xff\xfe" + json.dumps(base).encode()
        case "not-utf8-in-string":
            return json.dumps(base).encode().replace(b"bad", b"b\xc3\x28d", 1)
        case "oversized":
            return json.dumps({**base, "payload": "y" * OVERSIZED_BYTES}).encode()
        case "missing-required":
            del base[rng.choice(["id", "ts"])]
        case "null-required":
            base[rng.choice(["id", "ts"])] = None
        case "wrong-type-long":
            base["id"] = rng.choice(["abc", 1.5, [1], {"a": 1}])
        case "wrong-type-boolean":
            base["flag"] = rng.choice(["yes", 1, [True]])
        case "wrong-type-double":
            base["ratio"] = rng.choice(["abc", [1.0], {"x": 1}])
        case "wrong-type-list":
            base["tags"] = rng.choice(["notalist", 7, {"a": "b"}])
        case "int-overflow":
            base["small"] = rng.choice([2**31, -(2**31) - 1])
        case "long-overflow":
            base["big"] = rng.choice([2**63, -(2**63) - 1, 10**30])
        case "decimal-overflow":
            return json.dumps(base).replace('"id"', '"amount": 1' + "0" * 29 + ', "id"', 1).encode()
        case "bad-timestamp":
            base["ts"] = rng.choice(["not a time", "2024-13-01T00:00:00Z", "2024-02-30T00:00:00Z", True])
        case _:
            raise ValueError(kind)
    return json.dumps(base).encode()


def records(rng: random.Random, start: int, count: int) -> Iterator[Record]:
    """`count` records with ids `start...`: every bad kind once per 100 records, the rest good kinds (mostly
    plain, a few large)."""
    for i in range(start, start + count):
        slot = i % 100
        if slot < len(BAD_KINDS):
            kind = BAD_KINDS[slot]
            yield Record(str(i).encode(), _bad(rng, i, kind), kind)
            continue
        kind = rng.choices(GOOD_KINDS, weights=(50, 12, 12, 12, 1, 8, 3))[0]
        yield Record(str(i).encode(), _good(rng, i, kind), kind)


# --- the reference decoder ---------------------------------------------------------------------------------


class _BadValueError(Exception):
    pass


def _long(value: Any, bits: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadValueError(f"not an integer: {value!r}")
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise _BadValueError(f"out of range: {value}")
    return value


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        raise _BadValueError(f"not a number: {value!r}")
    try:
        number = Decimal(value) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        raise _BadValueError(f"not a number: {value!r}") from None
    if not number.is_finite():
        raise _BadValueError(f"not a number: {value!r}")
    with localcontext() as exact:
        exact.prec = 200  # quantize must not round or fail on the way: only the final check decides
        quantized = number.quantize(Decimal(1).scaleb(-SCALE), rounding=ROUND_HALF_UP)
    if len(quantized.as_tuple().digits) > PRECISION:
        raise _BadValueError(f"does not fit: {value}")
    return quantized


def _double(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise _BadValueError(f"not a number: {value!r}")
    return float(value)


def _boolean(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _BadValueError(f"not a boolean: {value!r}")


def _tags(value: Any) -> list[str | None] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _BadValueError(f"not a list: {value!r}")
    return [_text(v) for v in value]


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _timestamp(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise _BadValueError(f"not a timestamp: {value!r}")
    if isinstance(value, int | Decimal):
        return EPOCH + timedelta(seconds=int(value))
    if not isinstance(value, str):
        raise _BadValueError(f"not a timestamp: {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _BadValueError(f"not a timestamp: {value!r}") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def expected(value: bytes | None) -> dict[str, Any] | object:
    """The row `value` must become (column → value as pyiceberg reads it), or `BAD`."""
    if value is None or len(value) > MAX_RECORD_BYTES:
        return BAD
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return BAD
    try:
        parsed, _ = json.JSONDecoder(parse_float=Decimal).raw_decode(text.lstrip())
    except (json.JSONDecodeError, ValueError):
        return BAD
    if not isinstance(parsed, dict):
        return BAD
    try:
        row = {
            "id": _long(parsed.get("id"), 64),
            "name": _text(parsed.get("name")),
            "big": _long(parsed.get("big"), 64),
            "small": _long(parsed.get("small"), 32),
            "amount": _decimal(parsed.get("amount")),
            "ratio": _double(parsed.get("ratio")),
            "flag": _boolean(parsed.get("flag")),
            "tags": _tags(parsed.get("tags")),
            "payload": _text(parsed.get("payload")),
            "ts": _timestamp(parsed.get("ts")),
        }
    except _BadValueError:
        return BAD
    if row["id"] is None or row["ts"] is None:
        return BAD
    return row
