"""Why a decoded value does not fit its schema field: checks as (condition, message) pairs of Spark
column expressions, and the wording of the dead-letter reasons they produce.

A condition is false (never null) where the value is null; a message quotes at most `VALUE_QUOTE_CHARS`
of a field's raw value (`RECORD_QUOTE_CHARS` of a whole record), and only where its condition found the
value present. No Python UDF: everything runs in the JVM.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F  # noqa: N812 - the usual name

from icefall.api import SchemaField, TypeSpec

#: How much of a field's raw value, and of a whole record, an error message quotes.
VALUE_QUOTE_CHARS = 64
RECORD_QUOTE_CHARS = 100
#: The last year a timestamp may fall in (from year 1: ISO-8601's four digits, Python's `datetime`).
MAX_YEAR = 9999
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


Node = SchemaField | TypeSpec
Check = tuple[Column, Column]


def json_problem(text: Column) -> Column:
    start = F.regexp_replace(F.substring(text, 1, 1000), r"^\s+", "")
    first = F.substring(start, 1, 1)
    kind = (
        F.when(first == "[", "an array")
        .when(first == '"', "a string")
        .when(first.isin("t", "f"), "a boolean")
        .when(first == "n", "null")
        .otherwise("a number")
    )
    return (
        F.when(start == "", F.lit("malformed JSON: the value is empty"))
        .when(
            (first == "{") | F.try_parse_json(text).isNull(),
            F.concat(F.lit("malformed JSON: "), quote(text, RECORD_QUOTE_CHARS)),
        )
        .otherwise(
            F.concat(F.lit("not a JSON object (got "), kind, F.lit("): "), quote(text, RECORD_QUOTE_CHARS))
        )
    )


def quote(text: Column, limit: int) -> Column:
    shown = F.when(
        F.char_length(text) > limit, F.concat(F.substring(text, 1, limit), F.lit("..."))
    ).otherwise(text)
    return F.concat(F.lit("'"), shown, F.lit("'"))


def value_checks(node: Node, column: Column, path: str, *, quotable: bool) -> list[Check]:
    """Problems inside a non-null value of `node`'s type: (condition, message) pairs.

    Conditions are false (never null) when `column` is null. Messages quote the value only when
    `quotable` (outside lists and maps, where the offending element has no single column).
    """
    kind = node.parsed.name
    if kind == "uuid":
        return [_uuid_check(column, path, quotable=quotable)]
    if kind in ("timestamp", "timestamptz"):
        return [_year_check(column, path, quotable=quotable)]
    if kind == "fixed":
        return [_length_check(node, column, path, quotable=quotable)]
    if kind == "struct":
        return _struct_checks(node, column, path, quotable=quotable)
    if kind == "list":
        return _list_checks(node, column, path)
    if kind == "map":
        return _map_checks(node, column, path)
    return []


def _shown(value: Column, *, quotable: bool) -> Column:
    return quote(value, VALUE_QUOTE_CHARS) if quotable else F.lit("a value")


def _uuid_check(column: Column, path: str, *, quotable: bool) -> Check:
    return (
        column.isNotNull() & ~column.rlike(UUID_PATTERN),
        F.concat(F.lit(f"field '{path}': "), _shown(column, quotable=quotable), F.lit(" does not fit uuid")),
    )


def _year_check(column: Column, path: str, *, quotable: bool) -> Check:
    # A JSON number is epoch seconds: epoch milliseconds would land tens of thousands of years ahead,
    # past where Python's and many readers' datetimes end (years 1 to 9999).
    year = F.year(column)
    return (
        column.isNotNull() & ((year > MAX_YEAR) | (year < 1)),
        F.concat(
            F.lit(f"field '{path}': "),
            _shown(column.cast("string"), quotable=quotable),
            F.lit(f" is outside the years 1 to {MAX_YEAR} (a number is read as epoch seconds: millis?)"),
        ),
    )


def _length_check(node: Node, column: Column, path: str, *, quotable: bool) -> Check:
    return (
        column.isNotNull() & (F.length(column) != node.parsed.length),
        F.concat(
            F.lit(f"field '{path}': "),
            _shown(F.base64(column), quotable=quotable),
            F.lit(f" does not fit {node.parsed}"),
        ),
    )


def _struct_checks(node: Node, column: Column, path: str, *, quotable: bool) -> list[Check]:
    """Each required child present, and each child's own checks."""
    assert node.fields is not None
    checks: list[Check] = []
    for child in node.fields:
        child_column = column[child.name]
        child_path = f"{path}.{child.name}"
        if child.required:
            checks.append(
                (
                    column.isNotNull() & child_column.isNull(),
                    F.lit(f"required field '{child_path}' is missing or null"),
                )
            )
        checks.extend(value_checks(child, child_column, child_path, quotable=quotable))
    return checks


def _list_checks(node: Node, column: Column, path: str) -> list[Check]:
    assert node.element is not None
    return _item_checks(
        column,
        column,
        node.element,
        required=node.element_required,
        null_message=f"list '{path}' holds a null element, but spec says elementRequired",
        item_path=f"{path}[]",
    )


def _map_checks(node: Node, column: Column, path: str) -> list[Check]:
    assert node.value is not None
    return _item_checks(
        column,
        F.map_values(column),
        node.value,
        required=node.value_required,
        null_message=f"map '{path}' holds a null value, but spec says valueRequired",
        item_path=f"{path}{{}}",
    )


def _item_checks(
    column: Column, items: Column, item_type: TypeSpec, *, required: bool, null_message: str, item_path: str
) -> list[Check]:
    """The items (`items`, an array read from `column`) of a list or a map's values: none null where the
    spec requires it, and each passing the checks of `item_type`."""
    checks: list[Check] = []
    if required:
        checks.append((column.isNotNull() & F.exists(items, lambda i: i.isNull()), F.lit(null_message)))
    return [*checks, *_collection_checks(item_type, items, item_path)]


def _collection_checks(element: TypeSpec, array: Column, path: str) -> list[Check]:
    """The checks of `element` applied to every item of `array`: true when any item fails."""
    templates = value_checks(element, F.col("x"), path, quotable=False)

    def condition(i: int) -> Callable[[Column], Column]:
        return lambda item: value_checks(element, item, path, quotable=False)[i][0]

    return [
        (array.isNotNull() & F.coalesce(F.exists(array, condition(i)), F.lit(False)), message)
        for i, (_, message) in enumerate(templates)
    ]


def describe(node: Node) -> str:
    """A type as the spec spells it, with nested parts: `list<struct<sku: string, qty: int>>`."""
    parsed = node.parsed
    if parsed.name == "struct":
        assert node.fields is not None
        text = "struct<" + ", ".join(f"{f.name}: {describe(f)}" for f in node.fields) + ">"
    elif parsed.name == "list":
        assert node.element is not None
        text = f"list<{describe(node.element)}>"
    elif parsed.name == "map":
        assert node.key is not None and node.value is not None
        text = f"map<{describe(node.key)}, {describe(node.value)}>"
    else:
        return str(parsed)
    return text if len(text) <= 80 else text[:77] + "..."
