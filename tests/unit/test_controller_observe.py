"""What the operator does when the credentials a StreamingTable references are not in its environment
(`controller.observe`). No client is contacted: a missing credential stops the read before any connection.

Proves: missing Kafka and catalog secrets give an "unmeasured" note naming the field and the variable,
never an issue (the operator may simply not have been given them; the driver has); a catalog the adapter
cannot map is an issue whose text names the field. The mapping itself: tests/unit/test_catalog_config.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.api import ConditionReason, StreamingTable
from icefall.controller.observe import TableObserver

pytestmark = pytest.mark.unit


def secured() -> StreamingTable:
    ref = {"secretKeyRef": {"name": "creds", "key": "password"}}
    body: dict[str, Any] = {
        "metadata": {"name": "orders"},
        "spec": {
            "source": {
                "bootstrapServers": "kafka:9092",
                "topic": "orders",
                "security": {
                    "protocol": "SASL_PLAINTEXT",
                    "saslMechanism": "PLAIN",
                    "username": {"secretKeyRef": {"name": "creds", "key": "user"}},
                    "password": ref,
                },
            },
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {
                "namespace": "shop",
                "catalog": {
                    "name": "lake",
                    "type": "rest",
                    "uri": "https://catalog:8181",
                    "properties": {"s3.region": "eu-west-1"},
                    "secretProperties": {"token": {"secretKeyRef": {"name": "cat", "key": "token"}}},
                },
            },
        },
    }
    return StreamingTable.model_validate(body)


def test_missing_credentials_leave_the_figures_unmeasured_and_say_which() -> None:
    observed = TableObserver(environ={}, wait_seconds=10).observe("uid", secured())
    assert observed.issues == () and observed.facts is None and observed.watermarks is None
    assert "spec.table.catalog.secretProperties[token]" in observed.unmeasured
    assert "ICEFALL_CATALOG_TOKEN" in observed.unmeasured
    assert "spec.source.security.username" in observed.unmeasured
    assert "ICEFALL_KAFKA_USERNAME" in observed.unmeasured


def test_an_unmappable_catalog_is_an_issue_naming_the_field() -> None:
    st = secured()
    assert st.spec.table.catalog is not None
    catalog = st.spec.table.catalog.model_copy(update={"properties": {"cache-enabled": "true"}})
    table = st.spec.table.model_copy(update={"catalog": catalog})
    st = st.model_copy(update={"spec": st.spec.model_copy(update={"table": table})})
    observed = TableObserver(environ={"ICEFALL_CATALOG_TOKEN": "t0ken"}, wait_seconds=10).observe("uid", st)
    [issue] = [i for i in observed.issues if i.reason is ConditionReason.CATALOG_UNAVAILABLE]
    assert "spec.table.catalog.properties[cache-enabled]" in issue.message
    assert "t0ken" not in issue.message
