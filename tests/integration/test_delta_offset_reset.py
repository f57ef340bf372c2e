"""Offset resets of a Delta table (`spec.table.format: delta`), as for Iceberg tables: real Kafka, real Spark,
a real kube-apiserver for the cluster's request.

Proves, with `icefall run` as a user starts it, on a local Delta table whose topic is deleted and created
again (twice):
- ingestion stops (exit 4) and says to run `icefall reset-offsets`;
- the cluster's request (what the driver pod runs before its first batch: `apply_reset_request` on the
  Delta table) resets the offsets in one metadata-only Delta version, records the request in
  `icefall.offset-resets`, sends an `OffsetsReset` Event read back from the API server, and applied again
  (a restarted driver) commits nothing; `icefall reset-offsets -f` then has nothing to reset (exit 1);
- after the second recreation `icefall reset-offsets -f --to earliest` resets it (exit 0), and every run
  after a reset takes the new topic's records: each id exactly once, the rows of the old topics kept, the
  history of both resets kept through the batches committed after them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from icefall.api import streaming_table_from_object
from icefall.commands.delta import reset_when_reachable
from icefall.commands.reset_request import apply_reset_request
from icefall.commands.table import delta_target
from icefall.commit.delta import DeltaLog
from icefall.commit.state import OFFSET_RESETS
from icefall.controller.kube import Kube
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.plan.names import ANNOTATION_RESET_OFFSETS
from icefall.plan.offset_reset import ResetRequest
from icefall.plan.outages import Service
from icefall.testing.delta import delta_ids, delta_manifest
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import produce, recreate_topic, watermarks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "delta-reset"
TOPIC = "it-delta-reset"


def recreate(kafka: KafkaBroker, first_id: int, count: int) -> None:
    """The topic deleted and created again, then `count` records from id `first_id`."""
    recreate_topic(kafka, TOPIC, partitions=2)
    produce(kafka, TOPIC, first_id, count)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefall.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_a_recreated_topic_is_reset_by_the_clusters_request_and_by_the_cli(
    kafka: KafkaBroker, kube: KubeAPIServer, tmp_path: Path
) -> None:
    location = str(tmp_path / "orders")
    manifest, state = tmp_path / "table.yaml", tmp_path / "state"
    manifest.write_text(delta_manifest("delta-reset", kafka.bootstrap, TOPIC, location, max_records=50))
    kafka.create_topic(TOPIC, partitions=2)
    produce(kafka, TOPIC, 0, 60)

    def caught_up() -> None:
        done = run_until_caught_up(manifest, state)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert DeltaLog(location).snapshot().committed.offsets == watermarks(kafka, TOPIC)

    caught_up()
    recreate(kafka, 100, 40)
    stopped = run_until_caught_up(manifest, state)
    assert stopped.returncode == 4, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    assert "icefall reset-offsets" in stopped.stdout + stopped.stderr

    # The cluster's request, as the driver pod applies it before its first batch.
    install_crds(kube, REPO / "crds", NAMESPACE)
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    now = datetime.now(UTC)
    request = ResetRequest("earliest", now.replace(microsecond=0))
    body: dict[str, Any] = yaml.safe_load(manifest.read_text())
    body["metadata"] = {"name": "orders", "namespace": NAMESPACE}
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("icefall.dev", "v1alpha1", NAMESPACE, "streamingtables", body)
    kube_client = Kube(api)
    kube_client.patch_annotations(NAMESPACE, "orders", {ANNOTATION_RESET_OFFSETS: request.to_annotation()})
    st = streaming_table_from_object(
        custom.get_namespaced_custom_object("icefall.dev", "v1alpha1", NAMESPACE, "streamingtables", "orders")
    )
    assert reset_when_reachable(st, location, kube_client, lambda: False)  # what the driver pod runs
    version = DeltaLog(location).latest_version()
    said: list[str] = []
    again = apply_reset_request(st, delta_target(st, location), kube_client, now=now, say=said.append)
    assert again == "done-before" and DeltaLog(location).latest_version() == version, said
    events = client.CoreV1Api(api).list_namespaced_event(
        NAMESPACE, field_selector="involvedObject.name=orders"
    )
    assert [(e.reason, e.type) for e in events.items] == [("OffsetsReset", "Normal")]
    nothing = cli("reset-offsets", "-f", str(manifest), "--state-dir", str(state), "--to", "earliest")
    assert nothing.returncode == 1 and "nothing to reset" in nothing.stdout, nothing.stdout + nothing.stderr
    caught_up()

    recreate(kafka, 200, 20)
    reset = cli("reset-offsets", "-f", str(manifest), "--state-dir", str(state), "--to", "earliest")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert "now follows topic id" in reset.stdout
    caught_up()

    assert delta_ids(location) == Counter([*range(60), *range(100, 140), *range(200, 220)])
    history = json.loads(DeltaLog(location).snapshot().configuration[OFFSET_RESETS])
    assert [h["reason"] for h in history] == ["topic-recreated", "topic-recreated"]
    assert history[0]["request"] == request.id and "request" not in history[1]


def test_a_driver_waits_out_an_object_store_down_before_its_reset_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The driver pod applies a reset request before its first batch: with the table's S3 store down (no
    server on its port) it waits, as a batch does, instead of crashing; it gives up only when stopped."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "icefall",
        "AWS_SECRET_ACCESS_KEY": "icefall-secret",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    location = "s3://lake/orders"
    body: dict[str, Any] = yaml.safe_load(
        delta_manifest("delta-reset", "127.0.0.1:9", TOPIC, location, max_records=50)
    )
    request = ResetRequest("earliest", datetime.now(UTC).replace(microsecond=0))
    annotations = {ANNOTATION_RESET_OFFSETS: request.to_annotation()}
    body["metadata"] = {"name": "orders", "namespace": NAMESPACE, "annotations": annotations}
    st = streaming_table_from_object(body)
    waited: list[Service | None] = []
    stopped_after_two_attempts = lambda: len(waited) >= 2  # noqa: E731
    assert not reset_when_reachable(st, location, None, stopped_after_two_attempts, listener=waited.append)
    assert waited == [Service.OBJECT_STORE, Service.OBJECT_STORE]
