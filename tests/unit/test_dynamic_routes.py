"""Dynamic routes: the spec (`spec.dynamicRoute`) and the pure sorting of the names a batch computed
(`icefall.plan.routing.dynamic_names`).

Proves: a dynamic route is accepted with its defaults (the whole value as the name, spec.table's namespace,
`DEFAULT_MAX_TABLES`), its template split around `{value}`, and the names it must never write (spec.table,
the dead-letter table, static routes' tables in its namespace); a missing or extra `name`, a template
without `{value}` or with other characters, a regex that does not compile or has two groups, a cap above
`MAX_DYNAMIC_TABLES`, a field not in the schema, a condition that is not record-local, a layout on a
missing column and the forms routes do not support yet are refused naming the field and the fix. Of the
names a batch found, known tables are written, new ones created in sorted order up to the cap, and a name
that is not an identifier, names another table or is past the cap is refused with a reason quoting it
(truncated).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import NameFrom, StreamingTable
from icefall.api.routes import DEFAULT_MAX_TABLES, MAX_DYNAMIC_TABLES, QUOTED_CHARS
from icefall.plan.routing import DynamicNames, dynamic_names, reads_headers

pytestmark = pytest.mark.unit

DYNAMIC = {"from": "Field", "name": "kind", "nameTemplate": "events_{value}"}


def st(**spec: Any) -> StreamingTable:
    base: dict[str, Any] = {
        "source": {"topic": "events", "bootstrapServers": "k:9092"},
        "format": {"schema": [{"name": "kind", "type": "string"}, {"name": "n", "type": "long"}]},
        "table": {"namespace": "shop", "name": "events"},
        "dynamicRoute": DYNAMIC,
    }
    return StreamingTable.model_validate({"metadata": {"name": "events"}, "spec": {**base, **spec}})


def refused(**spec: Any) -> str:
    with pytest.raises(ValidationError) as error:
        st(**spec)
    return str(error.value)


def test_a_dynamic_route_is_accepted_with_its_defaults() -> None:
    table = st()
    route = table.spec.dynamic_route
    assert route is not None and route.from_ is NameFrom.FIELD
    assert (route.prefix, route.suffix, route.max_tables) == ("events_", "", DEFAULT_MAX_TABLES)
    assert table.dynamic_namespace == ("shop",)
    assert table.spec.routed
    assert table.dynamic_reserved == {"events": "spec.table", "events_dlq": "the dead-letter table"}
    topic = st(dynamicRoute={"from": "Topic", "pattern": r"^db\.inv\.(.+)$", "namespace": "cdc.inv"})
    assert topic.spec.dynamic_route is not None and topic.spec.dynamic_route.name_template == "{value}"
    assert topic.dynamic_namespace == ("cdc", "inv") and topic.dynamic_reserved == {}
    with_route = st(
        routes=[{"table": {"name": "events_click"}, "when": "kind = 'click'"}], unrouted="DeadLetter"
    )
    assert with_route.dynamic_reserved["events_click"] == "spec.routes[0]'s table"


@pytest.mark.parametrize(
    ("dynamic", "words"),
    [
        ({"from": "Field"}, ["name", "from Field needs", "set name"]),
        ({"from": "Header"}, ["from Header needs"]),
        ({"from": "Key", "name": "k"}, ["from Key takes no name", "remove it"]),
        ({"from": "Topic", "nameTemplate": "events"}, ["nameTemplate", "{value} exactly once"]),
        ({"from": "Topic", "nameTemplate": "{value}_{value}"}, ["{value} exactly once"]),
        ({"from": "Topic", "nameTemplate": "ev-{value}"}, ["'ev-{value}'", "letters, digits and '_'"]),
        ({"from": "Topic", "nameTemplate": "1{value}"}, ["not starting with a digit"]),
        ({"from": "Topic", "pattern": "(unclosed"}, ["pattern", "is not a regex"]),
        ({"from": "Topic", "pattern": "(a)(b)"}, ["pattern", "2 groups; use one"]),
        ({"from": "Topic", "pattern": "^(a+)+$"}, ["pattern", "nested quantifiers"]),
        ({"from": "Topic", "pattern": r"^(x)-\1$"}, ["pattern", "backreferences"]),
        ({"from": "Topic", "pattern": r"^(?P<t>\w+)$"}, ["pattern", "'(?P' is Python's syntax"]),
        ({"from": "Topic", "pattern": r"(?a)^(\w+)$"}, ["pattern", "'(?a' is Python's syntax"]),
        ({"from": "Topic", "maxTables": MAX_DYNAMIC_TABLES + 1}, ["maxTables", str(MAX_DYNAMIC_TABLES)]),
        ({"from": "Topic", "maxTables": 0}, ["maxTables"]),
        ({"from": "Field", "name": "nope"}, ["dynamicRoute.name", "'nope' is not a field", "kind"]),
        ({"from": "Topic", "when": "kind IN (SELECT kind FROM other)"}, ["dynamicRoute.when", "SELECT"]),
        ({"from": "Topic", "table": {"sortOrder": [{"field": "nope"}]}},
         ["dynamicRoute.table.sortOrder[0].field", "nope"]),
        ({"from": "Topic", "table": {"properties": {"icefall.offsets": "{}"}}}, ["icefall.offsets"]),
        ({"from": "Topic", "namespace": "bad-ns"}, ["dynamicRoute.namespace"]),
    ],
)  # fmt: skip
def test_what_a_dynamic_route_refuses_names_the_field_and_the_fix(
    dynamic: dict[str, Any], words: list[str]
) -> None:
    message = refused(dynamicRoute=dynamic)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"mode": "upsert", "key": ["n"]}, ["dynamicRoute", "mode append"]),
        ({"unrouted": "DeadLetter", "deadLetter": {"table": {"enabled": False}}}, ["unrouted", "use Table"]),
    ],
)  # fmt: skip
def test_what_dynamic_routes_do_not_support_yet_is_refused(spec: dict[str, Any], words: list[str]) -> None:
    message = refused(**spec)
    for word in words:
        assert word in message, message


def test_unrouted_applies_with_a_dynamic_route_alone() -> None:
    assert st(unrouted="DeadLetter").spec.unrouted is not None
    assert "add routes" in refused(dynamicRoute=None, unrouted="DeadLetter")


def test_new_names_are_created_in_sorted_order_and_known_ones_written() -> None:
    names = dynamic_names(["e_view", "e_click", "e_buy"], ["e_click"], {}, max_tables=5)
    assert names == DynamicNames(("e_buy", "e_view"), {})


def test_a_name_that_is_not_an_identifier_is_refused_quoting_it() -> None:
    long = "x" * 300
    names = dynamic_names(["e_bad-name", "e_ok", "", "1st", long], [], {}, max_tables=10)
    assert names.new == ("e_ok",)
    assert set(names.refused) == {"e_bad-name", "", "1st", long}
    assert "'e_bad-name' is not a valid identifier" in names.refused["e_bad-name"]
    assert names.refused["e_bad-name"].startswith("dynamic route: ")
    assert (
        f"'{'x' * QUOTED_CHARS}...'" in names.refused[long]
        and "x" * (QUOTED_CHARS + 1) not in names.refused[long]
    )


def test_names_past_the_cap_are_refused_and_the_cap_counts_the_known_tables() -> None:
    names = dynamic_names(["d", "c", "b", "a"], ["z"], {}, max_tables=3)
    assert names.new == ("a", "b")  # sorted: the same choice on every writer
    assert set(names.refused) == {"c", "d"}
    assert "would be table 4, past maxTables 3" in names.refused["c"]
    assert dynamic_names(["b"], ["a", "b"], {}, max_tables=1) == DynamicNames()  # known: written past the cap


def test_a_name_of_another_table_of_the_streaming_table_is_refused() -> None:
    names = dynamic_names(["events", "ok"], [], {"events": "spec.table"}, max_tables=1)
    assert names.new == ("ok",)
    assert "'events' is spec.table" in names.refused["events"]


def test_headers_are_read_for_a_name_from_a_header() -> None:
    assert reads_headers([], dynamic_from_header=True)
    assert not reads_headers([])
