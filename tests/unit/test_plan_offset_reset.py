"""A cluster's offset reset request, the `icefall.dev/reset-offsets` annotation (`icefall.plan.offset_reset`).

Proves: a request reads back as it was written (its id the request time in UTC); what is not a request is
refused with the expected shape in the message; a request expires an hour either side of now; the
annotation is part of the driver's spec hash only when set (a table without one keeps its hash, so an
operator upgrade rolls no driver), two requests hash differently; a request that cannot be read is a
problem of the annotation's field (the driver is held, Degraded InvalidSpec).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from icefall.api import StreamingTable, streaming_table_from_object
from icefall.plan.children import ANNOTATION_RESTART, desired_children, spec_hash
from icefall.plan.names import ANNOTATION_RESET_OFFSETS
from icefall.plan.offset_reset import FIELD, ResetRequest, ResetRequestError, parse_reset_request
from icefall.plan.settings import OperatorSettings

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


def test_a_request_reads_back_as_written() -> None:
    request = ResetRequest("latest", NOW)
    assert request.to_annotation() == '{"to":"latest","requestedAt":"2026-11-28T10:00:00Z"}'
    assert parse_reset_request(request.to_annotation()) == request
    paris = datetime(2026, 11, 28, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    assert ResetRequest("earliest", paris).id == "2026-11-28T10:00:00Z"
    assert parse_reset_request(None) is None and parse_reset_request("  ") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", "not a reset request"),
        ('{"to": "earliest"}', "not a reset request"),
        ('{"to": "earliest", "requestedAt": "2026-11-28T10:00:00Z", "id": 1}', "not a reset request"),
        ('{"to": "oldest", "requestedAt": "2026-11-28T10:00:00Z"}', "'oldest' is not earliest or latest"),
        ('{"to": "latest", "requestedAt": "yesterday"}', "RFC 3339 time with a zone"),
        ('{"to": "latest", "requestedAt": "2026-11-28T10:00:00"}', "RFC 3339 time with a zone"),
    ],
)
def test_what_is_not_a_request_is_refused_saying_what_one_looks_like(text: str, expected: str) -> None:
    with pytest.raises(ResetRequestError, match=expected) as refused:
        parse_reset_request(text)
    if "not a reset request" in expected:
        assert '"to": "earliest" or "latest"' in str(refused.value)


def test_a_request_expires_an_hour_either_side_of_now() -> None:
    request = ResetRequest("earliest", NOW)
    assert not request.expired(NOW + timedelta(minutes=59))
    assert request.expired(NOW + timedelta(minutes=61))
    assert request.expired(NOW - timedelta(minutes=61))  # a clock far ahead of the pod's


CATALOG = {"name": "lake", "type": "sql", "uri": "sqlite:///c.db", "warehouse": "/w"}


def table(**annotations: str) -> StreamingTable:
    return streaming_table_from_object(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders", "annotations": annotations},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {
                    "catalog": {"name": "lake", "type": "sql", "uri": "sqlite:///c.db", "warehouse": "/w"}
                },
            },
        }
    )


def hashed(st: StreamingTable) -> str:
    return spec_hash(st, image="icefall:1", settings=OperatorSettings(), master="local[2]")


def test_the_request_is_in_the_spec_hash_only_when_set() -> None:
    plain = hashed(table())
    assert hashed(table(**{"example.com/owner": "team"})) == plain
    first = hashed(table(**{ANNOTATION_RESET_OFFSETS: ResetRequest("earliest", NOW).to_annotation()}))
    later = ResetRequest("earliest", NOW + timedelta(minutes=5)).to_annotation()
    assert plain != first != hashed(table(**{ANNOTATION_RESET_OFFSETS: later}))
    # Not the same as a restart annotation of the same value.
    assert first != hashed(table(**{ANNOTATION_RESTART: ResetRequest("earliest", NOW).to_annotation()}))


def test_a_request_that_cannot_be_read_is_a_problem_of_the_annotation() -> None:
    def problems(st: StreamingTable) -> list[str]:
        children = desired_children(
            st,
            namespace="shop",
            uid="u",
            generation=1,
            image="icefall:1",
            operator_settings=OperatorSettings(),
        )
        return [str(p) for p in children.problems]

    assert problems(table(**{ANNOTATION_RESET_OFFSETS: ResetRequest("latest", NOW).to_annotation()})) == []
    (problem,) = problems(table(**{ANNOTATION_RESET_OFFSETS: "latest"}))
    assert problem.startswith(f"{FIELD}: not a reset request")
