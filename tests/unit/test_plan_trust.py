"""No credential lending, decided (pure): which Secrets a StreamingTable may reference (`plan.grants`), and
`deletionPolicy: Delete`'s purge Job and steps (`plan.purge`). (The operator reads no table at all:
tests/integration/test_operator_trust.py.)

Proves: a Secret is usable only with the label icefall.dev/streamingtables=allow, whether a credential
reference or spec.pods names it, and each refusal names the field, the Secret and the fix (a missing Secret
too); such a table is Ingesting=False and Ready=False, reason SecretNotAllowed, and a running driver is
stopped with a Warning Event; the purge Job runs `icefall purge` with the recorded table-uuids under the
driver's ServiceAccount with only the catalog's secretKeyRef variables, the restricted security context, an
owner reference, and fails at once on a refusal; `purge_step` keeps the table without a recorded uuid, for
another StreamingTable that recorded the same uuid, with a Secret not granted, after a failure or the
deadline, and drops it only through a completed Job.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from icefall.api import ConditionReason, ConditionStatus, ConditionType, StreamingTable
from icefall.plan.conditions import Issue, Observations, derive_conditions
from icefall.plan.driver import Action, DriverHistory, DriverPod, DriverState, EventType, PodPhase, decide
from icefall.plan.grants import SECRET_GRANT_LABEL, secret_refusals, secret_uses
from icefall.plan.purge import (
    EXIT_REFUSED,
    JobState,
    PurgeStep,
    job_state,
    last_words,
    purge_job,
    purge_step,
)
from icefall.plan.settings import OperatorSettings

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ALLOW = {SECRET_GRANT_LABEL: "allow"}


def table(*, security: dict[str, Any] | None = None, secrets: dict[str, Any] | None = None) -> StreamingTable:
    return StreamingTable.model_validate(
        {
            "metadata": {"name": "orders", "generation": 3},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders", "security": security or {}},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {
                    "namespace": "shop",
                    "catalog": {
                        "name": "lake",
                        "type": "rest",
                        "uri": "https://catalog:8181",
                        "secretProperties": secrets or {},
                    },
                },
                "deletionPolicy": "Delete",
            },
        }
    )


def ref(secret: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": secret, "key": key}}


SASL = {"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN"}
SECURED = table(
    security={**SASL, "username": ref("kafka", "user"), "password": ref("kafka", "password")},
    secrets={"credential": ref("lake", "credential")},
)


# --- grants -------------------------------------------------------------------------------------------


def test_only_granted_secrets_may_be_referenced_and_each_refusal_names_field_secret_and_fix() -> None:
    uses = secret_uses(SECURED.spec)
    assert {(u.path, u.secret) for u in uses} == {
        ("spec.source.security.username", "kafka"),
        ("spec.source.security.password", "kafka"),
        ("spec.table.catalog.secretProperties[credential]", "lake"),
    }
    assert secret_refusals(uses, {"kafka": ALLOW, "lake": ALLOW}, "shop") == []
    refusals = secret_refusals(uses, {"kafka": {"team": "a"}, "lake": None}, "shop")
    assert len(refusals) == 3
    password = next(r for r in refusals if r.startswith("spec.source.security.password: "))
    assert "Secret 'kafka' is not granted to StreamingTables" in password
    assert "kubectl -n shop label secret kafka icefall.dev/streamingtables=allow" in password
    missing = next(r for r in refusals if r.startswith("spec.table.catalog.secretProperties[credential]"))
    assert "Secret 'lake' does not exist in namespace shop" in missing
    # Another value than "allow" is no grant.
    assert secret_refusals(uses, {"kafka": {SECRET_GRANT_LABEL: "yes"}, "lake": ALLOW}, "shop")


def test_a_secret_spec_pods_names_needs_the_grant_too() -> None:
    """The pod policy may allow a Secret in spec.pods (podPolicy.secrets, or one the spec references
    elsewhere); the Secret's owner must still have granted it, as for a credential reference."""
    body = SECURED.model_dump(by_alias=True, exclude_none=True)
    body["spec"]["pods"] = {
        "common": {"volumes": [{"name": "ca", "secret": {"secretName": "shared-ca"}}]},
        "driver": {"env": [{"name": "TOKEN", "valueFrom": ref("shared-token", "t")}]},
        "executor": {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "kafka"}}]}}]},
    }
    uses = secret_uses(StreamingTable.model_validate(body).spec)
    pods = [(u.path, u.secret, u.key) for u in uses if u.path.startswith("spec.pods.")]
    assert pods == [
        ("spec.pods.common.volumes[0].secret.secretName", "shared-ca", ""),
        ("spec.pods.driver.env[0].valueFrom.secretKeyRef.name", "shared-token", "t"),
        ("spec.pods.executor.volumes[0].projected.sources[0].secret.name", "kafka", ""),
    ]
    granted = {"kafka": ALLOW, "lake": ALLOW, "shared-token": ALLOW}
    (refusal,) = secret_refusals(uses, {**granted, "shared-ca": {"team": "a"}}, "shop")
    path = "spec.pods.common.volumes[0].secret.secretName"
    assert refusal.startswith(f"{path}: Secret 'shared-ca' is not granted")
    assert secret_refusals(uses, {**granted, "shared-ca": ALLOW}, "shop") == []


def test_env_references_name_no_secret() -> None:
    assert secret_uses(table(secrets={"credential": {"env": "HOME"}}).spec) == []


def test_a_table_that_may_not_use_a_secret_runs_no_driver_and_says_why() -> None:
    refusal = "spec.source.security.password: Secret 'kafka' is not granted to StreamingTables; ..."
    running = DriverPod(uid="p1", phase=PodPhase.RUNNING, spec_hash="h")
    decision = decide(running, desired_hash="h", history=DriverHistory(), now=NOW, refused=refusal)
    assert decision.action is Action.DELETE and decision.state is DriverState.NOT_WANTED
    (event,) = decision.events
    assert event.type is EventType.WARNING and event.reason.value == "SecretNotAllowed"
    assert (
        decide(None, desired_hash="h", history=DriverHistory(), now=NOW, refused=refusal).action
        is Action.KEEP
    )

    observed = Observations(
        driver=DriverState.NOT_WANTED, issues=(Issue(ConditionReason.SECRET_NOT_ALLOWED, refusal),)
    )
    conditions = {c.type: c for c in derive_conditions(observed, SECURED, NOW)}
    for kind, status in (
        (ConditionType.READY, ConditionStatus.FALSE),
        (ConditionType.INGESTING, ConditionStatus.FALSE),
        (ConditionType.DEGRADED, ConditionStatus.TRUE),
    ):
        assert (conditions[kind].status, conditions[kind].reason) == (
            status,
            ConditionReason.SECRET_NOT_ALLOWED,
        )
    assert refusal in conditions[ConditionType.READY].message


# --- the purge Job ------------------------------------------------------------------------------------


def test_the_purge_job_runs_as_the_driver_with_the_catalogs_credentials_only() -> None:
    job = purge_job(
        SECURED, namespace="shop", uid="st-1", image="icefall:1", settings=OperatorSettings(),
        table_uuid="u-1", dead_letter_table_uuid="u-2", active_seconds=300.4,
    )  # fmt: skip
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("batch/v1", "Job", "orders-purge")
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("StreamingTable", "st-1", True)
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == 300 and spec["backoffLimit"] >= 1
    (rule,) = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [EXIT_REFUSED]
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "icefall-orders-driver" and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["name"] == rule["onExitCodes"]["containerName"] == "purge"
    assert container["image"] == "icefall:1" and "ports" not in container
    assert container["command"] == [
        "icefall", "purge", "--namespace", "shop", "--name", "orders",
        "--table-uuid", "u-1", "--dead-letter-table-uuid", "u-2",
    ]  # fmt: skip
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    from_secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert from_secrets == {"ICEFALL_CATALOG_CREDENTIAL": "lake"}  # not Kafka's: the purge never reads it
    assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "purge"


def test_job_state_and_last_words() -> None:
    assert job_state(None) is None
    assert job_state({"status": {}}) == JobState()
    complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert job_state(complete) == JobState(complete=True)
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}}
    state = job_state(failed)
    assert state is not None and state.failed and state.message == "PodFailurePolicy"
    pods = [
        {"metadata": {"creationTimestamp": "2026-01-01T00:00:01Z"}, "status": {"containerStatuses": [
            {"state": {"terminated": {"message": "PurgeRefused: older\n"}}}]}},
        {"metadata": {"creationTimestamp": "2026-01-01T00:00:09Z"}, "status": {"containerStatuses": [
            {"state": {"terminated": {"message": "PurgeRefused: newest\n"}}}]}},
    ]  # fmt: skip
    assert last_words(pods) == "PurgeRefused: newest" and last_words([]) == ""


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"table_uuid": None}, PurgeStep.KEEP),
        ({"uuid_owners": ["shop/other"]}, PurgeStep.KEEP_FOR_OWNER),
        ({"refusals": ["spec...: Secret 'lake' is not granted"]}, PurgeStep.KEEP),
        ({}, PurgeStep.CREATE),
        ({"job": JobState()}, PurgeStep.WAIT),
        ({"job": JobState(complete=True)}, PurgeStep.DROPPED),
        ({"job": JobState(failed=True)}, PurgeStep.FAILED),
        ({"job": JobState(), "elapsed_seconds": 601}, PurgeStep.TIMED_OUT),
        ({"elapsed_seconds": 601}, PurgeStep.TIMED_OUT),
        ({"job": JobState(complete=True), "elapsed_seconds": 601}, PurgeStep.DROPPED),
    ],
)
def test_purge_steps(given: dict[str, Any], expected: PurgeStep) -> None:
    args: dict[str, Any] = {
        "table_uuid": "u-1", "uuid_owners": [], "refusals": [], "job": None,
        "elapsed_seconds": 5.0, "deadline_seconds": 600.0,
    }  # fmt: skip
    assert purge_step(**{**args, **given}) is expected
