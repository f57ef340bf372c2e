"""A pass applies only the children whose rendering changed, and every child now and then
(`icefall.plan.applying`), on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from icefall.plan.applying import ABSENT, REPAIR_SECONDS, Applied, child_key, due, manifest_digest

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 26, tzinfo=UTC)
ROLE = {"kind": "Role", "metadata": {"name": "icefall-orders-driver", "labels": {"a": "1"}}, "rules": []}


def test_a_child_never_applied_or_changed_is_due() -> None:
    wanted = manifest_digest(ROLE)
    assert due(None, wanted, T0)
    changed = {**ROLE, "rules": [{"verbs": ["get"]}]}
    assert manifest_digest(changed) != wanted
    assert due(Applied(wanted, T0), manifest_digest(changed), T0 + timedelta(seconds=1))
    assert due(Applied(ABSENT, T0), wanted, T0)  # deleted before, wanted now
    assert due(Applied(wanted, T0), ABSENT, T0)  # applied before, unwanted now


def test_an_unchanged_child_waits_for_the_repair_interval() -> None:
    wanted = manifest_digest(ROLE)
    last = Applied(wanted, T0)
    assert not due(last, wanted, T0 + timedelta(seconds=REPAIR_SECONDS - 1))
    assert due(last, wanted, T0 + timedelta(seconds=REPAIR_SECONDS))
    assert not due(Applied(ABSENT, T0), ABSENT, T0 + timedelta(seconds=30))
    assert due(last, wanted, T0 + timedelta(seconds=5), repair_seconds=5)


def test_the_digest_ignores_key_order_and_the_key_names_the_child() -> None:
    reordered = {
        "rules": [],
        "metadata": {"labels": {"a": "1"}, "name": "icefall-orders-driver"},
        "kind": "Role",
    }
    assert manifest_digest(reordered) == manifest_digest(ROLE)
    assert child_key(ROLE) == ("Role", "icefall-orders-driver")
