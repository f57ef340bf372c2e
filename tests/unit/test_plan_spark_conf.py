"""Every process's Spark configuration: one producer (`icefall.plan.spark_conf`) on top of the session's base.

Proves: `icefall run` gets its master and application name, and the FAIR scheduler with the pools file
beside the session module only with in-process maintenance; a pod's entry point starts Spark with what the
operator rendered into `ICEFALL_SPARK_CONF`, with the Kubernetes master turned into the API server's
address as the kubelet gives it to every container (IPv6 too), and the application name of its role where
the rendered conf names none; the CLI's tools name their application; the conf a process asks for wins
over the session's base, whose loopback binding follows the master the process asks for. No Spark is
started.
"""

from __future__ import annotations

import json

import pytest

from icefall.plan.env import ENV_SPARK_CONF
from icefall.plan.spark_conf import (
    KUBERNETES_MASTER,
    compaction_conf,
    embedded_conf,
    in_cluster_master,
    in_pod,
    tool_conf,
)
from icefall.spark.session import FAIR_SCHEDULING, session_conf

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _jars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("icefall.spark.session.spark_jars", lambda: [])


def test_icefall_run_schedules_fairly_only_with_in_process_maintenance() -> None:
    alone = session_conf([], extra_conf=embedded_conf("orders", master="local[3]", maintain=False))
    assert (alone["spark.master"], alone["spark.app.name"]) == ("local[3]", "icefall-orders")
    assert "spark.scheduler.mode" not in alone and "spark.scheduler.allocation.file" not in alone
    assert alone["spark.driver.host"] == "127.0.0.1"  # a local master binds to loopback
    fair = session_conf([], extra_conf=embedded_conf("orders", master="local[3]", maintain=True))
    assert {k: fair[k] for k in FAIR_SCHEDULING} == FAIR_SCHEDULING


def test_a_pod_starts_spark_with_the_rendered_conf_at_the_in_cluster_address() -> None:
    rendered = {"spark.master": KUBERNETES_MASTER, "spark.app.name": "icefall-orders", "spark.x": "1"}
    environ = {
        ENV_SPARK_CONF: json.dumps(rendered),
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    conf = session_conf([], extra_conf=in_pod(environ, "orders", role="ingest", master="local[2]"))
    assert conf["spark.master"] == "k8s://https://10.96.0.1:443"
    assert (conf["spark.app.name"], conf["spark.x"]) == ("icefall-orders", "1")
    assert "spark.driver.bindAddress" not in conf  # not a local master: Spark binds as on Kubernetes


def test_the_compaction_pods_name_their_application_by_role() -> None:
    environ = {ENV_SPARK_CONF: json.dumps(compaction_conf())}
    conf = in_pod(environ, "orders", role="compact", master="local[2]")
    assert conf == {**compaction_conf(), "spark.app.name": "icefall-orders-compact"}
    assert in_pod({}, "orders", role="compact", master="local[2]")["spark.master"] == "local[2]"


def test_the_cli_tools_name_their_application() -> None:
    assert (
        session_conf([], extra_conf=tool_conf("orders", "verify"))["spark.app.name"]
        == "icefall-verify-orders"
    )
    assert tool_conf("orders", "read") == {"spark.app.name": "icefall-read-orders"}
    assert session_conf([], extra_conf=tool_conf("orders", "read"))["spark.master"] == "local[2]"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
            "k8s://https://10.96.0.1:443",
        ),
        (
            {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"},
            "k8s://https://[fd00::1]:6443",
        ),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "k8s://https://10.96.0.1:443"),
        ({}, KUBERNETES_MASTER),  # not in a pod: as rendered
    ],
)
def test_the_driver_reaches_the_api_server_at_its_in_cluster_address(
    environ: dict[str, str], expected: str
) -> None:
    assert in_cluster_master(KUBERNETES_MASTER, environ) == expected
    assert in_cluster_master("local[2]", environ) == "local[2]"
