"""Which StreamingTable owns a contested catalog table (`plan.claims`).

Proves: identities compare case-insensitively over catalog name, namespace and table name (and differ when
any of them differs); the oldest claim wins, ties on the one-second timestamps broken by uid, whatever the
order the claims are seen in; a claim is read from an API object and absent before the server stored it.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest

from icefall.api import StreamingTable
from icefall.plan.claims import Claim, claim_from_object, claimed_by_other, table_identity, winner

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def st(name: str, *, table: str = "orders", namespace: str = "shop", catalog: str = "lake") -> StreamingTable:
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {
                "namespace": namespace,
                "name": table,
                "catalog": {
                    "name": catalog,
                    "type": "sql",
                    "uri": "sqlite:////x.db",
                    "warehouse": "file:///w",
                },
            },
        },
    }
    return StreamingTable.model_validate(body)


def delta(name: str, location: str, *, table: str = "orders", namespace: str = "shop") -> StreamingTable:
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {"format": "delta", "namespace": namespace, "name": table, "location": location},
        },
    }
    return StreamingTable.model_validate(body)


def test_a_delta_tables_identity_is_its_folder_whatever_the_table_is_named() -> None:
    one = table_identity(delta("a", "s3://lake/tables/orders"))
    assert one == table_identity(delta("b", "s3a://lake/tables/orders/", table="other", namespace="x"))
    assert one != table_identity(delta("a", "s3://lake/tables/orders-eu"))
    assert one != table_identity(delta("a", "s3://lake/other/orders"))
    assert one != table_identity(st("a"))  # an Iceberg table of the same name is another table


def test_identity_is_catalog_namespace_and_table_case_insensitively() -> None:
    assert table_identity(st("a")) == table_identity(st("b", table="ORDERS", catalog="Lake"))
    assert table_identity(st("a")) != table_identity(st("a", table="payments"))
    assert table_identity(st("a")) != table_identity(st("a", namespace="other"))
    assert table_identity(st("a")) != table_identity(st("a", catalog="warehouse"))


def test_the_oldest_claim_wins_then_the_smaller_uid_in_any_order() -> None:
    old = Claim(T0, "uid-b", "ns", "first")
    tie = Claim(T0, "uid-c", "ns", "tie")
    young = Claim(T0.replace(minute=5), "uid-a", "ns", "young")
    for order in itertools.permutations([old, tie, young]):
        assert winner(order) == old
    assert claimed_by_other(young, [old, tie]) == old
    assert claimed_by_other(old, [tie, young]) is None
    assert winner([]) is None


def test_a_claim_is_read_from_the_api_object() -> None:
    obj = {
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "creationTimestamp": "2024-05-01T12:00:00Z"}
    }
    assert claim_from_object(obj) == Claim(T0, "u1", "ns", "a")
    assert claim_from_object({"metadata": {"name": "a"}}) is None
