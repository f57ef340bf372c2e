"""Status models follow Kubernetes conventions, and every model is ready to become a structural CRD schema.

Proves: conditions carry only reasons from the closed enum that fit their type, at most one per type,
and serialise with camelCase names and RFC 3339 times; status tolerates fields from a newer operator;
the JSON schema of the whole resource has a description on every property, closed objects for the spec,
no unions other than "value or null", and the conditions list is a map keyed by type.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import (
    REASONS_BY_TYPE,
    Condition,
    ConditionReason,
    ConditionType,
    StreamingTable,
    StreamingTableStatus,
)

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def condition(kind: ConditionType, reason: ConditionReason, status: str = "True") -> dict[str, Any]:
    return {
        "type": kind.value,
        "status": status,
        "reason": reason.value,
        "message": "m",
        "lastTransitionTime": "2024-05-01T12:00:00Z",
        "observedGeneration": 4,
    }


def test_full_status_round_trips_in_camel_case() -> None:
    status = StreamingTableStatus.model_validate(
        {
            "observedGeneration": 4,
            "conditions": [
                condition(ConditionType.READY, ConditionReason.RUNNING),
                condition(ConditionType.FRESHNESS_MET, ConditionReason.BEHIND_TARGET, "False"),
            ],
            "freshness": {
                "seconds": 3.5,
                "lagRecords": 120,
                "partitionLag": {"0": 100, "1": 20},
                "lastCommitTime": "2024-05-01T12:00:00Z",
                "snapshotId": 8_765_432_109_876_543_210 // 2,
            },
            "table": {"files": 12, "avgFileSizeBytes": 104857600, "snapshots": 30},
            "dataLossRecords": 7,
        }
    )
    assert status.freshness is not None and status.freshness.partition_lag == {0: 100, 1: 20}
    assert status.conditions[0].last_transition_time == T0
    dumped = status.model_dump(mode="json")
    assert dumped["conditions"][0]["lastTransitionTime"] == "2024-05-01T12:00:00Z"
    assert dumped["freshness"]["partitionLag"] == {"0": 100, "1": 20}
    assert StreamingTableStatus.model_validate(dumped) == status
    ready = status.condition(ConditionType.READY)
    assert ready is not None and ready.reason is ConditionReason.RUNNING
    assert status.condition(ConditionType.COMPACTING) is None


def test_reason_must_fit_condition_type() -> None:
    with pytest.raises(ValidationError, match="CompactionFailed is not a reason for FreshnessMet"):
        Condition.model_validate(condition(ConditionType.FRESHNESS_MET, ConditionReason.COMPACTION_FAILED))


def test_unknown_reason_or_type_is_refused() -> None:
    raw = condition(ConditionType.READY, ConditionReason.RUNNING)
    with pytest.raises(ValidationError):
        Condition.model_validate({**raw, "reason": "AllGood"})
    with pytest.raises(ValidationError):
        Condition.model_validate({**raw, "type": "Healthy"})
    with pytest.raises(ValidationError):
        Condition.model_validate({**raw, "status": "true"})


def test_every_reason_belongs_to_some_condition_type() -> None:
    used = set().union(*REASONS_BY_TYPE.values())
    assert used == set(ConditionReason)
    assert set(REASONS_BY_TYPE) == set(ConditionType)


def test_one_condition_per_type() -> None:
    with pytest.raises(ValidationError, match="a second Ready condition"):
        StreamingTableStatus.model_validate(
            {
                "conditions": [
                    condition(ConditionType.READY, ConditionReason.RUNNING),
                    condition(ConditionType.READY, ConditionReason.STARTING),
                ]
            }
        )


def test_status_ignores_fields_from_a_newer_operator() -> None:
    status = StreamingTableStatus.model_validate({"observedGeneration": 1, "compaction": {"queued": 3}})
    assert status.observed_generation == 1


# --- CRD readiness ---------------------------------------------------------------------------------------


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}/{i}")


SCHEMA = StreamingTable.model_json_schema()


def test_every_property_has_a_description() -> None:
    missing = [
        f"{path}/{name}"
        for path, node in _walk(SCHEMA)
        if isinstance(node.get("properties"), dict) and not path.endswith("/properties")
        for name, prop in node["properties"].items()
        if not prop.get("description")
    ]
    assert missing == []


def test_only_nullable_unions() -> None:
    for path, node in _walk(SCHEMA):
        for keyword in ("anyOf", "oneOf", "allOf"):
            if keyword in node:
                members = node[keyword]
                assert keyword == "anyOf" and len(members) == 2 and {"type": "null"} in members, path


def test_spec_objects_are_closed_and_metadata_status_open() -> None:
    defs = SCHEMA["$defs"]
    open_models = {
        "ObjectMeta",
        "StreamingTableStatus",
        "Condition",
        "FreshnessStatus",
        "TableStatus",
        "WriterReport",
        "PartitionLag",
        "DestinationStatus",
    }
    for name, definition in defs.items():
        if definition.get("type") != "object":
            continue
        if name == "Volume":  # a pod volume: its name, and a volume source kept as written
            assert definition.get("additionalProperties") is True, name
        elif name in open_models:
            assert definition.get("additionalProperties") is not False, name
        else:
            assert definition.get("additionalProperties") is False, name


def test_conditions_are_a_list_map_keyed_by_type() -> None:
    conditions = SCHEMA["$defs"]["StreamingTableStatus"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_enums_are_closed_in_the_schema() -> None:
    defs = SCHEMA["$defs"]
    assert defs["ConditionType"]["enum"] == ["Ready", "Ingesting", "FreshnessMet", "Degraded", "Compacting"]
    assert defs["DeletionPolicy"]["enum"] == ["Retain", "Delete"]
    assert defs["StartingPositionType"]["enum"] == ["earliest", "latest", "timestamp"]
