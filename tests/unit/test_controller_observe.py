"""The operator holds no table credential (`controller.observe`). No client is contacted here.

Proves: a table that references credentials (Kafka, catalog; `secretKeyRef` or `{env: NAME}`) is not read
at all, even when the operator's environment holds the very variables its pods get: an "unmeasured" note
names the fields and says the driver measures it, never an issue; the observer's own environment for
references is empty whatever this process's is; a catalog the adapter cannot map is an issue whose text
names the field. The mapping itself: tests/unit/test_catalog_config.py. The real operator process against
endpoints that record what they get: tests/integration/test_operator.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.api import ConditionReason, StreamingTable
from icefall.controller.observe import NO_CREDENTIALS, TableObserver
from icefall.plan.conditions import Issue

pytestmark = pytest.mark.unit


KAFKA_SASL = {
    "protocol": "SASL_PLAINTEXT",
    "saslMechanism": "PLAIN",
    "username": {"secretKeyRef": {"name": "creds", "key": "user"}},
    "password": {"secretKeyRef": {"name": "creds", "key": "password"}},
}


def table(
    *,
    security: dict[str, Any] | None = None,
    secrets: dict[str, Any] | None = None,
    properties: dict[str, str] | None = None,
) -> StreamingTable:
    """A StreamingTable on a REST catalog whose Kafka `security` and catalog `secrets` are given."""
    body: dict[str, Any] = {
        "metadata": {"name": "orders"},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders", "security": security or {}},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {
                "namespace": "shop",
                "catalog": {
                    "name": "lake",
                    "type": "rest",
                    "uri": "https://catalog:8181",
                    "properties": properties or {"s3.region": "eu-west-1"},
                    "secretProperties": secrets or {},
                },
            },
        },
    }
    return StreamingTable.model_validate(body)


def secured() -> StreamingTable:
    return table(security=KAFKA_SASL, secrets={"token": {"secretKeyRef": {"name": "cat", "key": "token"}}})


def test_a_table_referencing_credentials_is_left_to_its_driver_whatever_the_environment_holds() -> None:
    given = {"ICEFALL_CATALOG_TOKEN": "t0ken", "ICEFALL_KAFKA_USERNAME": "u", "ICEFALL_KAFKA_PASSWORD": "p"}
    observed = TableObserver(environ=given, wait_seconds=10).observe("uid", secured())
    assert observed.issues == () and observed.facts is None and observed.watermarks is None
    assert "spec.table.catalog.secretProperties[token]" in observed.unmeasured
    assert "spec.source.security.username" in observed.unmeasured
    assert "driver" in observed.unmeasured and "t0ken" not in observed.unmeasured


def test_an_env_reference_is_not_resolved_by_the_operator() -> None:
    st = table(secrets={"token": {"env": "HOME"}})
    observed = TableObserver(environ={"HOME": "/home/op"}, wait_seconds=10).observe("uid", st)
    assert "spec.table.catalog.secretProperties[token]" in observed.unmeasured and observed.facts is None


def test_the_observers_environment_for_references_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICEFALL_CATALOG_PASSWORD", "operator-secret")
    assert dict(TableObserver().environ) == {} and dict(NO_CREDENTIALS) == {}


def test_an_unmappable_catalog_is_an_issue_naming_the_field() -> None:
    st = table(properties={"cache-enabled": "true"})  # no credential: the operator reads it
    issues: list[Issue] = []
    assert TableObserver()._load_table(st, issues, []) is None  # the catalog half only: no Kafka here
    [issue] = [i for i in issues if i.reason is ConditionReason.CATALOG_UNAVAILABLE]
    assert "spec.table.catalog.properties[cache-enabled]" in issue.message
