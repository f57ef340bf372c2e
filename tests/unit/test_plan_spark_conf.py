"""Every process's Spark configuration: one producer (`icefall.plan.spark_conf`) on top of the session's base.

Proves: `icefall run` gets its master and application name, and the FAIR scheduler with the pools file
beside the session module only with in-process maintenance; a pod's entry point starts Spark with what the
operator rendered into `ICEFALL_SPARK_CONF`, with the Kubernetes master turned into the API server's
address as the kubelet gives it to every container (IPv6 too), and the application name of its role where
the rendered conf names none; the CLI's tools name their application; the conf a process asks for wins
over the session's base, whose loopback binding follows the master the process asks for; shuffle partitions
are twice the cores a job can use (local[N], local[*] on this machine's cores, executors x cores on
Kubernetes) and a table's `spec.spark.conf` reaches both `icefall run` and the driver pod last, winning over
them; every session has `spark.sql.runSQLOnFiles=false`, which no table can set. No Spark is started.
"""

from __future__ import annotations

import json

import pytest

from icefall.api import StreamingTable
from icefall.plan.env import ENV_SPARK_CONF
from icefall.plan.settings import OperatorSettings
from icefall.plan.spark_conf import (
    KUBERNETES_MASTER,
    compaction_conf,
    driver_conf,
    embedded_conf,
    in_cluster_master,
    in_pod,
    shuffle_partitions,
    tool_conf,
)
from icefall.spark.session import FAIR_SCHEDULING, session_conf

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _jars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("icefall.spark.session.spark_jars", lambda: [])


def orders(conf: dict[str, str] | None = None) -> StreamingTable:
    return StreamingTable.model_validate(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop"},
                "spark": {"conf": conf or {}},
            },
        }
    )


def test_icefall_run_schedules_fairly_only_with_in_process_maintenance() -> None:
    alone = session_conf([], extra_conf=embedded_conf(orders(), master="local[3]", maintain=False))
    assert (alone["spark.master"], alone["spark.app.name"]) == ("local[3]", "icefall-orders")
    assert "spark.scheduler.mode" not in alone and "spark.scheduler.allocation.file" not in alone
    assert alone["spark.driver.host"] == "127.0.0.1"  # a local master binds to loopback
    fair = session_conf([], extra_conf=embedded_conf(orders(), master="local[3]", maintain=True))
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


def test_shuffle_partitions_are_twice_the_cores_a_job_can_use(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shuffle_partitions("local[2]", cores=64) == 4  # the old fixed 4, on icefall run's default
    assert shuffle_partitions("local[8]", cores=1) == 16
    assert shuffle_partitions("local", cores=8) == 2
    assert shuffle_partitions("local[*]", cores=6) == 12
    assert shuffle_partitions(KUBERNETES_MASTER, cores=0) == 2
    monkeypatch.setattr("icefall.spark.session.os.cpu_count", lambda: 6)
    assert session_conf([], master="local[*]")["spark.sql.shuffle.partitions"] == "12"
    assert session_conf([], master="local[3]")["spark.sql.shuffle.partitions"] == "6"


def render_driver(st: StreamingTable, master: str, executor: dict[str, str] | None = None) -> dict[str, str]:
    return driver_conf(
        st, OperatorSettings(max_executors=8, executor_cores=2), namespace="shop", master=master,
        image="icefall:1", digest="abc", host_network=False, executor=executor or {},
    )  # fmt: skip


def test_a_driver_on_kubernetes_shuffles_into_twice_its_executors_cores() -> None:
    conf = render_driver(orders(), KUBERNETES_MASTER)
    assert conf["spark.sql.shuffle.partitions"] == "32"  # 8 executors x 2 cores x 2
    # A local master inside the driver pod: the session counts the pod's cores.
    assert "spark.sql.shuffle.partitions" not in render_driver(orders(), "local[*]")


def test_a_tables_spark_conf_reaches_icefall_run_and_the_driver_pod_last() -> None:
    st = orders({"spark.sql.shuffle.partitions": "200", "spark.memory.fraction": "0.5"})
    local = session_conf([], extra_conf=embedded_conf(st, master="local[2]", maintain=True))
    assert (local["spark.sql.shuffle.partitions"], local["spark.memory.fraction"]) == ("200", "0.5")
    assert local["spark.scheduler.mode"] == "FAIR"  # Icefall's own keys are still there
    pod = render_driver(st, KUBERNETES_MASTER, executor={"spark.memory.fraction": "0.7"})
    assert (pod["spark.sql.shuffle.partitions"], pod["spark.memory.fraction"]) == ("200", "0.5")
    in_driver = session_conf([], extra_conf=in_pod({ENV_SPARK_CONF: json.dumps(pod)}, "orders", role="ingest",
                                                   master="local[2]"))  # fmt: skip
    assert in_driver["spark.sql.shuffle.partitions"] == "200"
    assert render_driver(st, "local[4]")["spark.sql.shuffle.partitions"] == "200"


def test_no_session_runs_sql_on_files_and_no_table_turns_it_back_on() -> None:
    st = orders({"spark.sql.shuffle.partitions": "8"})
    pod = render_driver(st, KUBERNETES_MASTER)
    sessions = {
        "icefall run": embedded_conf(st, master="local[2]", maintain=True),
        "driver pod": in_pod({ENV_SPARK_CONF: json.dumps(pod)}, "orders", role="ingest", master="local[2]"),
        "compaction pod": in_pod({ENV_SPARK_CONF: json.dumps(compaction_conf())}, "orders", role="compact",
                                 master="local[2]"),
        "verify": tool_conf("orders", "verify"),
    }  # fmt: skip
    for process, extra in sessions.items():
        assert session_conf([], extra_conf=extra)["spark.sql.runSQLOnFiles"] == "false", process
    with pytest.raises(ValueError, match=r"spark\.sql\.runSQLOnFiles"):
        orders({"spark.sql.runSQLOnFiles": "true"})
