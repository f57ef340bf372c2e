"""Transforms are confined to the record (`icefall.api.sql_expressions`, checked in `spec.transforms`).

Proves:
- the expressions of the examples, tests and README (columns, arithmetic, struct paths, casts with
  precision, CASE, LIKE ANY, IS DISTINCT FROM, extract/trim with FROM, lambdas, strings holding '--' or a
  URL) pass;
- a call of a function off the allow-list is refused naming the function and the field, quoted or
  qualified names included (`reflect`, `java_method`, `try_reflect`, `` `reflect` ``, `"reflect"`,
  `builtin.reflect`, `input_file_name`, `from_protobuf`, `xpath`, `current_user()`, aggregates,
  generators, `identifier('...')`);
- subqueries (SELECT, TABLE, VALUES, WITH, FROM outside extract/trim/...), LATERAL VIEW, paths read as
  files (`` text.`/etc/passwd` ``), comments, `;` and a backslash before a quote (where raw and escaped
  strings would end differently) are refused;
- the messages reach the manifest's problems with the field's path: `spec.transforms.select[1]: function
  reflect is not allowed: transforms may only use record-local functions (see docs/security.md)`.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.api import ManifestError, streaming_table_from_object
from icefall.api.sql_expressions import ALLOWED_FUNCTIONS, expression_problem

pytestmark = pytest.mark.unit

ACCEPTED = [
    "*",
    "amount * 100 AS cents",
    "customer.name AS who",
    "_kafka.offset AS kafka_offset",
    "size(items) AS n_items",
    "id % 3 != 0",
    "cents > 1000 AND status = 'PAID'",
    "cast(amount AS decimal(10, 2)) AS amount",
    "CAST(code AS varchar(3))",
    "amount::double",
    "CASE WHEN (amount > 1) THEN upper(name) ELSE lower(name) END AS who",
    "name LIKE ANY ('a%', 'b%')",
    "a IS NOT DISTINCT FROM b",
    "extract(year FROM ts) AS y",
    "trim(BOTH 'x' FROM name)",
    "substring(name FROM 2 FOR 3)",
    "transform(items, x -> upper(x.sku)) AS skus",
    "exists(items, x -> x.qty > 1)",
    "concat('--not a comment--', \"http://example.com/\" , name)",
    "'it''s' AS quoted",
    "sha2(cast(id AS string), 256) AS digest",
    "from_json(payload, 'a INT, b STRING').a AS a",
    "`weird name` + 1 AS fixed",
    "coalesce(nullif(trim(note), ''), 'none')",
    "date_format(ts, 'yyyy-MM-dd') AS day",
]


@pytest.mark.parametrize("expression", ACCEPTED)
def test_record_local_expressions_pass(expression: str) -> None:
    assert expression_problem(expression) is None


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("reflect('java.lang.Runtime', 'getRuntime')", "function reflect is not allowed"),
        ("java_method('java.lang.System', 'exit', 1)", "function java_method is not allowed"),
        ("try_reflect('java.lang.Thread', 'sleep', 1L)", "function try_reflect is not allowed"),
        ("REFLECT ('a', 'b')", "function REFLECT is not allowed"),
        ("`reflect`('a', 'b')", "function reflect is not allowed"),
        ("\"reflect\"('a', 'b')", "function reflect is not allowed"),
        ("builtin.reflect('a', 'b')", "function reflect is called by a qualified name"),
        ("lake.db.my_udf(id)", "function my_udf is called by a qualified name"),
        ("my_udf(id)", "function my_udf is not allowed"),
        ("identifier('reflect')('a', 'b')", "function identifier is not allowed"),
        ("input_file_name()", "function input_file_name is not allowed"),
        ("from_protobuf(value, 'M', '/etc/passwd')", "function from_protobuf is not allowed"),
        ("xpath(value, '/a')", "function xpath is not allowed"),
        ("current_user()", "function current_user is not allowed"),
        ("count(*)", "function count is not allowed"),
        ("any(flag)", "function any is not allowed"),
        ("explode(items)", "function explode is not allowed"),
        ("(SELECT max(secret) FROM other.table)", "SELECT is not allowed"),
        ("id IN (SELECT id FROM lake.hr.salaries)", "SELECT is not allowed"),
        ("EXISTS (TABLE lake.hr.salaries)", "TABLE is not allowed"),
        ("id IN (VALUES 1)", "VALUES is not allowed"),
        ("id FROM lake.hr.salaries", "FROM is not allowed"),
        ("WITH t AS (x) x", "WITH is not allowed"),
        ("x LATERAL VIEW explode(y)", "LATERAL is not allowed"),
        ("text.`/etc/passwd`", "`/etc/passwd` reads files by path"),
        ("parquet.`s3://bucket/other/table`", "reads files by path"),
        ("json.`data/x.json`", "reads files by path"),
        ("id -- reflect('a', 'b')", "comments are not allowed"),
        ("id /* x */", "comments are not allowed"),
        ("id; DROP TABLE t", "';' ends a statement"),
        ("r'a\\' || reflect('a', 'b') || '", "a backslash before a quote inside a string is ambiguous"),
        ("'unclosed", "a string is not closed"),
        ("$x", "'$' is not allowed"),
    ],
)
def test_anything_beyond_the_record_is_refused_naming_it(expression: str, message: str) -> None:
    problem = expression_problem(expression)
    assert problem is not None and message in problem, problem


def test_the_allow_list_holds_no_function_that_reaches_outside_the_record() -> None:
    outside = {"reflect", "java_method", "try_reflect", "input_file_name", "from_avro", "from_protobuf"}
    outside |= {"xpath", "from_xml", "current_user", "current_database", "version", "spark_partition_id"}
    outside |= {"monotonically_increasing_id", "count", "sum", "explode", "raise_error", "range"}
    assert not outside & ALLOWED_FUNCTIONS


def manifest(transforms: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "orders"},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "transforms": transforms,
        },
    }


def test_a_refused_transform_names_the_field_and_the_function() -> None:
    obj = manifest(
        {"select": ["id", "reflect('java.lang.Runtime', 'getRuntime') AS r"], "filter": "id IN (TABLE x)"}
    )
    with pytest.raises(ManifestError) as raised:
        streaming_table_from_object(obj)
    assert [str(p) for p in raised.value.problems] == [
        "spec.transforms.select[1]: function reflect is not allowed: transforms may only use record-local "
        "functions (see docs/security.md)",
        "spec.transforms.filter: TABLE is not allowed: a transform is an expression over the record, not a "
        "query of other tables (see docs/security.md)",
    ]
    accepted = streaming_table_from_object(manifest({"select": ["id", "upper(cast(id AS string)) AS s"]}))
    assert accepted.spec.transforms.select == ["id", "upper(cast(id AS string)) AS s"]
