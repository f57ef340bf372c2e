"""Offset resets for a table in a cluster (`icefall.plan.offset_reset`) on a real kube-apiserver, with real
Kafka and a SQL catalog (SQLite) for the driver's side.

Proves:
- `icefall reset-offsets --namespace N --name X --to earliest` (the CLI with a kubeconfig, no table
  credential) writes the request annotation onto the StreamingTable; the operator's next pass
  (`reconcile.apply` against the API server) deletes the driver Pod of the old spec hash and the pass after
  creates one with a new hash: a new driver at once, no backoff;
- a request that cannot be read holds the driver (Degraded InvalidSpec naming the annotation, same Pod);
- the driver's side (`apply_reset_request`, what `icefall ingest` runs before its first batch), for a table
  whose committed offsets are past the topic's end: resets them (and records the request in
  `icefall.offset-resets`) once, with an `OffsetsReset` Event on the StreamingTable read back from the API
  server; run again, as a restarted driver would, it commits nothing; a request with nothing left to reset,
  and an expired one, are refused with a Warning Event and commit nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kubernetes import client, config

from icefall.api import ConditionReason, streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import ensure_tables
from icefall.commands.reset_request import apply_reset_request
from icefall.commands.table import iceberg_target
from icefall.commit import read_committed
from icefall.commit.state import OFFSET_RESETS, CommittedState
from icefall.controller import reconcile
from icefall.controller.kube import Kube
from icefall.controller.status import StatusMemory
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.plan.names import ANNOTATION_RESET_OFFSETS, LABEL_SPEC_HASH
from icefall.plan.offset_reset import ResetRequest
from icefall.testing.streams import produce

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "reset-request"
GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> client.ApiClient:
    install_crds(kube, REPO / "crds", NAMESPACE)
    return config.new_client_from_config(config_file=str(kube.kubeconfig))


def create_table(api: client.ApiClient, name: str, lake: Path, bootstrap: str, topic: str) -> Obj:
    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamingTable",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": topic},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long", "required": True}]},
            "table": {
                "namespace": "it",
                "name": name.replace("-", "_"),
                "catalog": {
                    "name": "lake", "type": "sql", "uri": f"sqlite:///{lake / 'catalog.db'}",
                    "warehouse": f"file://{lake / 'warehouse'}",
                },
            },
            "deadLetter": {"table": {"enabled": False}},
        },
    }  # fmt: skip
    custom = client.CustomObjectsApi(api)
    created: Obj = custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, obj)
    return created


def current(api: client.ApiClient, name: str) -> Obj:
    found: Obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, name
    )
    return found


def operator_pass(api: client.ApiClient, name: str, memory: StatusMemory) -> reconcile.Outcome:
    ctx = reconcile.Context(Kube(api), reconcile.Config(), memory, datetime.now(UTC))
    return reconcile.apply(current(api, name), ctx)


def driver_pod(api: client.ApiClient, name: str) -> client.V1Pod | None:
    try:
        return client.CoreV1Api(api).read_namespaced_pod(f"{name}-ingest", NAMESPACE)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_the_cli_request_restarts_the_driver_and_a_malformed_one_holds_it(
    api: client.ApiClient, kube: KubeAPIServer, tmp_path: Path
) -> None:
    create_table(api, "requested", tmp_path, "127.0.0.1:1", "events")
    memory = StatusMemory()
    operator_pass(api, "requested", memory)
    before = driver_pod(api, "requested")
    assert before is not None
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "reset-offsets",
         "--namespace", NAMESPACE, "--name", "requested", "--to", "earliest"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "OffsetsReset" in done.stdout
    annotation = current(api, "requested")["metadata"]["annotations"][ANNOTATION_RESET_OFFSETS]
    assert json.loads(annotation)["to"] == "earliest"
    operator_pass(api, "requested", memory)  # the Pod of the old spec hash is deleted...
    assert driver_pod(api, "requested") is None
    operator_pass(api, "requested", memory)  # ...and a new one created at once
    after = driver_pod(api, "requested")
    assert after is not None and after.metadata.uid != before.metadata.uid
    assert after.metadata.labels[LABEL_SPEC_HASH] != before.metadata.labels[LABEL_SPEC_HASH]

    Kube(api).patch_annotations(NAMESPACE, "requested", {ANNOTATION_RESET_OFFSETS: "earliest please"})
    operator_pass(api, "requested", memory)
    held = driver_pod(api, "requested")
    assert held is not None and held.metadata.uid == after.metadata.uid
    degraded = next(c for c in current(api, "requested")["status"]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", ConditionReason.INVALID_SPEC.value)
    assert ANNOTATION_RESET_OFFSETS in degraded["message"]


def commit_offsets(table: Any, offsets: dict[int, int]) -> None:
    """One row and the icefall.* properties in one commit, as ingestion commits them."""
    row = {"id": 1, "_kafka": {"partition": 0, "offset": 0, "timestamp": datetime.now(UTC)}}
    state = CommittedState(snapshot_id=None, topic="t", offsets=offsets, epoch=1, max_produce_time_ms=0)
    with table.transaction() as tx:
        tx.append(pa.Table.from_pylist([row], schema=table.schema().as_arrow()))
        tx.set_properties(state.to_properties())


def events(api: client.ApiClient, name: str) -> list[tuple[str, str, str]]:
    found = client.CoreV1Api(api).list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={name}"
    )
    return [(e.reason, e.type, e.message) for e in found.items]


def test_the_driver_applies_a_request_once_and_says_so_in_an_event(
    api: client.ApiClient, kafka: KafkaBroker, tmp_path: Path
) -> None:
    kafka.create_topic("reset-request", partitions=1)
    produce(kafka, "reset-request", 0, 10, partitions=[0])
    body = create_table(api, "ahead", tmp_path, kafka.bootstrap, "reset-request")
    catalog = CatalogConfig.for_table(streaming_table_from_object(body).spec).pyiceberg()
    table = ensure_tables(catalog, streaming_table_from_object(body)).table
    commit_offsets(table, {0: 50})  # past the topic's end (10): ingestion would stop, OffsetsAheadOfTopic
    kube, now, said = Kube(api), datetime.now(UTC), []

    def driver_start(request: ResetRequest) -> str | None:
        kube.patch_annotations(NAMESPACE, "ahead", {ANNOTATION_RESET_OFFSETS: request.to_annotation()})
        st = streaming_table_from_object(current(api, "ahead"))
        return apply_reset_request(st, iceberg_target(st, catalog), kube, now=now, say=said.append)

    request = ResetRequest("earliest", now.replace(microsecond=0))
    assert driver_start(request) == "reset"
    assert read_committed(table.refresh()).offsets == {0: 0}
    (reset,) = json.loads(table.properties[OFFSET_RESETS])
    assert reset["request"] == request.id and reset["to_offsets"] == {"0": 0}
    assert [(r, t) for r, t, _ in events(api, "ahead")] == [("OffsetsReset", "Normal")]
    snapshot = table.refresh().current_snapshot().snapshot_id

    assert driver_start(request) == "done-before"  # a restarted driver: nothing again
    later = ResetRequest("latest", now.replace(microsecond=0) + timedelta(seconds=1))
    assert driver_start(later) == "refused"  # the offsets point into the topic now: nothing to reset
    old = ResetRequest("earliest", now - timedelta(hours=2))
    assert driver_start(old) == "expired"
    assert table.refresh().current_snapshot().snapshot_id == snapshot, "nothing else was committed"
    assert len(json.loads(table.properties[OFFSET_RESETS])) == 1
    refused = [(r, t, m) for r, t, m in events(api, "ahead") if r == "OffsetResetRefused"]
    assert [t for _, t, _ in refused] == ["Warning", "Warning"]
    assert any("nothing to reset" in m for *_, m in refused) and any(
        "older than an hour" in m for *_, m in refused
    )
