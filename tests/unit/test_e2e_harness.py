"""The pure parts of the e2e harness switch (icefall.testing.harness), which `make e2e-kind` relies on.

Proves: without ICEFALL_E2E_KUBECONFIG (unset or empty) the e2e runs on the local harness; with it, on the
cluster of that file, and a path that does not exist fails instead of falling back to the local harness; a
cluster address (`name.namespace:port`, with or without a scheme or `.svc[.cluster.local]`) names the
Service and port a port-forward goes to, and its loopback form keeps the scheme; Kafka's forward uses the
broker's host listener on the same port at both ends, the others free loopback ports.
Not proven: that `kubectl port-forward` works (that needs a cluster with pods, so Docker for kind).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icefall.testing.harness import (
    E2E_KUBECONFIG,
    HOST_LISTENER_PORT,
    Forward,
    e2e_kubeconfig,
    forward_for,
    kind_forwards,
    on_loopback,
)

pytestmark = pytest.mark.unit

KAFKA, REST, S3 = "kafka-bootstrap.kafka:9092", "http://iceberg-rest.lake:8181", "http://minio.lake:9000"


def test_the_local_harness_unless_the_variable_names_a_kubeconfig(tmp_path: Path) -> None:
    assert e2e_kubeconfig({}) is None
    assert e2e_kubeconfig({E2E_KUBECONFIG: ""}) is None
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    assert e2e_kubeconfig({E2E_KUBECONFIG: str(kubeconfig)}) == kubeconfig
    with pytest.raises(FileNotFoundError, match=E2E_KUBECONFIG):
        e2e_kubeconfig({E2E_KUBECONFIG: str(tmp_path / "missing")})


@pytest.mark.parametrize(
    ("endpoint", "forward"),
    [
        (KAFKA, Forward("kafka", "kafka-bootstrap", 9092, 1234)),
        (REST, Forward("lake", "iceberg-rest", 8181, 1234)),
        ("https://minio.lake.svc.cluster.local:9000", Forward("lake", "minio", 9000, 1234)),
        ("minio.lake.svc:9000", Forward("lake", "minio", 9000, 1234)),
    ],
)
def test_a_cluster_address_names_its_service_and_port(endpoint: str, forward: Forward) -> None:
    assert forward_for(endpoint, 1234) == forward


@pytest.mark.parametrize("endpoint", ["localhost:9092", "http://minio:9000", "http://minio.lake"])
def test_an_address_that_is_no_service_is_refused(endpoint: str) -> None:
    with pytest.raises(ValueError, match="not a Service address"):
        forward_for(endpoint, 1234)


def test_the_loopback_form_keeps_the_scheme() -> None:
    assert on_loopback(KAFKA, 19092) == "127.0.0.1:19092"
    assert on_loopback(REST, 4321) == "http://127.0.0.1:4321"
    assert on_loopback("https://minio.lake:9000/", 4321) == "https://127.0.0.1:4321/"


def test_kafka_goes_to_its_host_listener_the_others_to_free_ports() -> None:
    forwards = kind_forwards(KAFKA, [REST, S3])
    assert forwards[KAFKA] == Forward("kafka", "kafka-bootstrap", HOST_LISTENER_PORT, HOST_LISTENER_PORT)
    assert (forwards[REST].service, forwards[REST].port) == ("iceberg-rest", 8181)
    assert (forwards[S3].service, forwards[S3].port) == ("minio", 9000)
    ports = [f.local_port for f in forwards.values()]
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)
