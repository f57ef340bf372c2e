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
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from kubernetes import client, config

from icefall.api import streaming_table_from_object
from icefall.commands.reset_request import apply_reset_request
from icefall.commands.table import delta_target
from icefall.commit.delta import DeltaLog
from icefall.commit.state import OFFSET_RESETS
from icefall.controller.kube import Kube
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.plan.names import ANNOTATION_RESET_OFFSETS
from icefall.plan.offset_reset import ResetRequest
from icefall.testing.delta import delta_ids, delta_manifest
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import produce, watermarks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "delta-reset"
TOPIC = "it-delta-reset"


def recreate(kafka: KafkaBroker, first_id: int, count: int) -> None:
    """The topic deleted and created again, then `count` records from id `first_id`."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})  # kept alive until the deletion is done
    admin.delete_topics([TOPIC])[TOPIC].result(30)
    deadline = time.monotonic() + 60
    while True:  # created again once Kafka has finished deleting it
        try:
            kafka.create_topic(TOPIC, partitions=2)
            break
        except Exception:
            assert time.monotonic() < deadline, "the topic could not be created again"
            time.sleep(0.5)
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
    said: list[str] = []
    assert (
        apply_reset_request(st, delta_target(st, location), kube_client, now=now, say=said.append) == "reset"
    )
    version = DeltaLog(location).latest_version()
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
