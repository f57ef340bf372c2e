"""No credential lending: the operator (`icefall operator`, a real process) against a real kube-apiserver,
with table credentials in its own environment that it must never use.

Proves:
- the operator, given ICEFALL_CATALOG_CREDENTIAL, ICEFALL_KAFKA_USERNAME/PASSWORD in its environment, sends
  nothing to the endpoints a table names (a REST catalog and OAuth endpoint, a Kafka bootstrap server: both
  small servers on 127.0.0.1 that record every connection), whether the table references a granted Secret
  or `{env: HOME}`: after many passes they have seen not one connection, and the table says the driver
  measures it;
- nor does it lend its network position: for tables that need no credential at all (a SQLite path on the
  operator's own disk, a PostgreSQL catalog without a password, a REST catalog without auth, PLAINTEXT
  Kafka: recording sockets on 127.0.0.1), after many passes no socket saw a connection and the SQLite path
  was never opened, and status shows what the table's driver reported (freshness, lag per partition, the
  table's figures);
- a table referencing a Secret without the label icefall.dev/streamingtables=allow runs no pod (no driver,
  compaction at 0) and says Ready=False, reason SecretNotAllowed, with the field, the Secret and the fix;
  once an admin labels the Secret, the driver Pod comes;
- `deletionPolicy: Delete` runs the purge Job (`icefall purge` under the driver's ServiceAccount) and waits
  for it: the test plays the Job controller and the kubelet (runs the Job's command, marks it Complete)
  and the tables are gone; a second StreamingTable that reaches the same table through another spelling of
  the catalog URI (an alias) and recorded the same table-uuid keeps it when it is deleted first;
- `icefall purge` refuses a table whose table-uuid is not the recorded one and drops nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from icefall.api import load_manifest, streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import ensure_tables
from icefall.controller.kube import Kube
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.ingest.report import BatchReport
from icefall.ingest.table_meter import TableMeter
from icefall.ingest.writer_status import WriterStatusReporter
from icefall.plan.grants import SECRET_GRANT_LABEL
from icefall.testing.e2e import Operator, wait_for
from icefall.testing.kubeapi import JsonApi

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "operator-trust"
ST = f"/apis/icefall.dev/v1alpha1/namespaces/{NAMESPACE}/streamingtables"
#: What the operator process holds in its environment, under the names the tables' pods use.
LENT = {
    "ICEFALL_CATALOG_CREDENTIAL": "operator-client:operator-secret",
    "ICEFALL_CATALOG_PASSWORD": "operator-db-secret",
    "ICEFALL_KAFKA_USERNAME": "operator-kafka-user",
    "ICEFALL_KAFKA_PASSWORD": "operator-kafka-secret",
}
Obj = dict[str, Any]


class Recorder:
    """A TCP server on 127.0.0.1 that records every connection and what it received; it answers an HTTP
    request with `{}` (posing as a REST catalog and its OAuth endpoint) and anything else with silence
    (posing as a Kafka broker)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(1)
                data = b""
                try:
                    data = conn.recv(65536)
                    if data.startswith((b"GET", b"POST", b"HEAD")):
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                        conn.sendall(b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
                except OSError:
                    pass
                self.received.append(data)

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> JsonApi:
    install_crds(kube, REPO / "crds", NAMESPACE)
    return JsonApi(config.new_client_from_config(config_file=str(kube.kubeconfig)))


@pytest.fixture(scope="module")
def operator(
    kube: KubeAPIServer, api: JsonApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    running = Operator(kube, NAMESPACE, tmp_path_factory.mktemp("operator") / "operator.log", env=LENT)
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert "Traceback" not in running.log.read_text(errors="replace"), running.tail()


def secret(api: JsonApi, name: str, data: dict[str, str], *, granted: bool = True) -> None:
    labels = {SECRET_GRANT_LABEL: "allow"} if granted else {}
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels},
        "stringData": data,
    }
    api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body)


def streaming_table(name: str, catalog: Obj, *, bootstrap: str = "127.0.0.1:1", **spec: Any) -> Obj:
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": "events"},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long", "required": True}]},
            "table": {"namespace": "it", "name": name.replace("-", "_"), "catalog": catalog},
            **spec,
        },
    }


def sqlite_catalog(lake: Path, **more: Any) -> Obj:
    return {"name": "lake", "type": "sql", "uri": f"sqlite:///{lake / 'catalog.db'}",
            "warehouse": f"file://{lake / 'warehouse'}", **more}  # fmt: skip


def condition(api: JsonApi, name: str, kind: str) -> Obj | None:
    st = api.get(f"{ST}/{name}") or {}
    return next((c for c in (st.get("status") or {}).get("conditions", []) if c["type"] == kind), None)


def passes(operator: Operator) -> int:
    """Full passes (`apply`) of the operator that finished, over all its tables (kopf logs each one)."""
    text = operator.log.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "Timer 'resync' succeeded" in line)


def test_the_operator_sends_its_own_environment_to_no_endpoint_a_table_names(
    api: JsonApi, operator: Operator
) -> None:
    catalog, kafka = Recorder(), Recorder()
    try:
        secret(api, "lake", {"credential": "table-client:table-secret"})
        secret(api, "kafka", {"user": "table", "password": "table-kafka-secret"})
        rest = {"name": "lake", "type": "rest", "uri": f"http://127.0.0.1:{catalog.port}"}
        sasl = {"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN"}
        bootstrap = f"127.0.0.1:{kafka.port}"
        credential = {"secretKeyRef": {"name": "lake", "key": "credential"}}
        lent = streaming_table(
            "lent",
            {**rest, "secretProperties": {"credential": credential}},
            bootstrap=bootstrap,
            source={"bootstrapServers": bootstrap, "topic": "events", "security": {
                **sasl, "username": {"secretKeyRef": {"name": "kafka", "key": "user"}},
                "password": {"secretKeyRef": {"name": "kafka", "key": "password"}},
            }},
        )  # fmt: skip
        homed = streaming_table(
            "homed",
            {**rest, "secretProperties": {"credential": {"env": "HOME"}}},
            source={"bootstrapServers": bootstrap, "topic": "events", "security": {
                **sasl, "username": {"env": "HOME"}, "password": {"env": "HOME"},
            }},
        )  # fmt: skip
        before = passes(operator)
        for obj in (lent, homed):
            api.call("POST", ST, obj)
        # Many passes over both (each one would read the table and the topic if it lent its credentials),
        # a resync per table and second.
        wait_for("20 passes", lambda: passes(operator) >= before + 20, timeout=60, details=operator.tail)
        assert catalog.received == [] and kafka.received == [], (catalog.received, kafka.received)
        for name in ("lent", "homed"):
            freshness = condition(api, name, "FreshnessMet")
            assert freshness is not None and freshness["reason"] == "NotMeasured", freshness
            assert "driver" in freshness["message"] and "not reported yet" in freshness["message"]
        log = operator.log.read_text(errors="replace")
        assert not [value for value in LENT.values() if value in log]
    finally:
        catalog.close()
        kafka.close()


def test_the_operator_lends_no_network_position_and_shows_what_the_driver_reports(
    kube: KubeAPIServer, api: JsonApi, operator: Operator, tmp_path: Path
) -> None:
    """Tables that need no credential at all, naming what only the operator could reach: a SQLite file on
    the operator's own disk, a PostgreSQL catalog with no password, a REST catalog with no auth, topics on
    PLAINTEXT Kafka (listening sockets on 127.0.0.1 that record every connection). After many passes over
    them, no socket saw a connection and the SQLite path was never opened (it would be created); the
    status of the SQLite table shows what its driver reported (its own pod, its own disk)."""
    postgres, rest, kafka = Recorder(), Recorder(), Recorder()
    operator_disk = tmp_path / "operator-disk"  # where the tenant points the operator's SQLite client
    operator_disk.mkdir()
    try:
        bootstrap = f"127.0.0.1:{kafka.port}"
        tables = {
            "on-disk": sqlite_catalog(operator_disk),
            "on-postgres": {"name": "lake", "type": "sql",
                            "uri": f"postgresql+psycopg2://icefall@127.0.0.1:{postgres.port}/lake",
                            "warehouse": f"file://{operator_disk / 'warehouse'}"},
            "on-rest": {"name": "lake", "type": "rest", "uri": f"http://127.0.0.1:{rest.port}"},
        }  # fmt: skip
        before = passes(operator)
        for name, catalog in tables.items():
            api.call("POST", ST, streaming_table(name, catalog, bootstrap=bootstrap))
        wait_for("20 passes", lambda: passes(operator) >= before + 20, timeout=60, details=operator.tail)
        seen = {"postgres": postgres.received, "rest": rest.received, "kafka": kafka.received}
        assert seen == {"postgres": [], "rest": [], "kafka": []}, seen
        assert list(operator_disk.iterdir()) == [], "the operator opened the SQLite path a table names"
        freshness = condition(api, "on-disk", "FreshnessMet")
        assert freshness is not None and freshness["reason"] == "NotMeasured", freshness
        assert "driver" in freshness["message"], freshness

        # The driver, in its own pod with its own disk (here a folder of the test's), reports.
        obj = streaming_table("on-disk", sqlite_catalog(tmp_path / "driver-disk"))
        driver_lake = CatalogConfig.for_table(streaming_table_from_object(obj).spec)
        ensure_tables(driver_lake.pyiceberg(), streaming_table_from_object(obj))
        reported = report_as_the_driver(kube, obj, driver_lake, lag={0: 3, 1: 0}, freshness=1.5)

        def measured() -> Obj | None:
            status = (api.get(f"{ST}/on-disk") or {}).get("status") or {}
            return status if (status.get("freshness") or {}).get("lagRecords") == 3 else None

        status = wait_for("the driver's figures in status", measured, timeout=30, details=operator.tail)
        assert status["freshness"]["seconds"] == 1.5
        assert status["freshness"]["partitionLag"] == {"0": 3, "1": 0}
        assert status["table"]["files"] == 0 and status["writer"]["tableUuid"] == reported
        freshness = condition(api, "on-disk", "FreshnessMet")
        assert freshness is not None and freshness["reason"] == "WithinTarget", freshness
        later = passes(operator)
        wait_for("10 more passes", lambda: passes(operator) >= later + 10, timeout=60, details=operator.tail)
        seen = {"postgres": postgres.received, "rest": rest.received, "kafka": kafka.received}
        assert seen == {"postgres": [], "rest": [], "kafka": []}, seen
        assert list(operator_disk.iterdir()) == []
    finally:
        postgres.close()
        rest.close()
        kafka.close()


def test_a_secret_without_the_grant_runs_no_pod_until_it_is_labelled(
    api: JsonApi, operator: Operator, tmp_path: Path
) -> None:
    secret(api, "ungranted", {"password": "p"}, granted=False)
    ref = {"secretKeyRef": {"name": "ungranted", "key": "password"}}
    api.call(
        "POST", ST, streaming_table("refused", sqlite_catalog(tmp_path, secretProperties={"password": ref}))
    )

    def refused() -> Obj | None:
        ready = condition(api, "refused", "Ready")
        return ready if ready and ready["reason"] == "SecretNotAllowed" else None

    ready = wait_for("Ready=False, SecretNotAllowed", refused, timeout=30, details=operator.tail)
    assert ready["status"] == "False"
    assert "spec.table.catalog.secretProperties[password]" in ready["message"]
    assert f"kubectl -n {NAMESPACE} label secret ungranted {SECRET_GRANT_LABEL}=allow" in ready["message"]
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    deployment = wait_for(
        "the compaction Deployment",
        lambda: api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/refused-compact"),
    )
    assert deployment["spec"]["replicas"] == 0 and api.get(f"{pods}/refused-ingest") is None

    api.call(
        "PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/ungranted",
        {"metadata": {"labels": {SECRET_GRANT_LABEL: "allow"}}}, content_type="application/merge-patch+json",
    )  # fmt: skip
    wait_for("the driver pod once granted", lambda: api.get(f"{pods}/refused-ingest"), timeout=30)


def report_as_the_driver(
    kube: KubeAPIServer,
    obj: Obj,
    catalog: CatalogConfig,
    *,
    lag: dict[int, int] | None = None,
    freshness: float = 0.0,
) -> str:
    """What the table's driver reports (its own ServiceAccount, impersonated): the table read with its
    catalog (`TableMeter`), the table-uuid among it, and with `lag` (per partition) a batch that landed
    `freshness` seconds behind. Returns the table-uuid."""
    st = streaming_table_from_object(obj)
    name = st.metadata.name
    driver = config.new_client_from_config(config_file=str(kube.kubeconfig))
    driver.set_default_header("Impersonate-User", f"system:serviceaccount:{NAMESPACE}:icefall-{name}-driver")
    meter = TableMeter(st, catalog)
    reading = meter.read_once()
    assert reading is not None
    reporter = WriterStatusReporter(Kube(driver), NAMESPACE, name, meter=meter)
    if lag is None:
        reporter(None)
    else:
        total = sum(lag.values())
        reporter(BatchReport(1, 1, 0, 1.0, 0.1, 7, {}, total, freshness, partition_lag=lag))
    return reading.table_uuid


def events(api: JsonApi, name: str) -> list[tuple[str, str]]:
    found = api.call(
        "GET",
        f"/api/v1/namespaces/{NAMESPACE}/events",
        query=[("fieldSelector", f"involvedObject.name={name}")],
    )
    return [(e["reason"], e["message"]) for e in found["items"]]


def test_delete_purges_with_a_job_and_an_alias_keeps_the_table_it_shares(
    kube: KubeAPIServer, api: JsonApi, operator: Operator, tmp_path: Path
) -> None:
    lake = CatalogConfig.sqlite(tmp_path / "catalog.db", tmp_path / "warehouse", name="lake")
    owner = streaming_table("dropme", sqlite_catalog(tmp_path), deletionPolicy="Delete")
    # The same catalog through another spelling of its URI, the same table: another claim, the same table.
    alias_catalog = {**sqlite_catalog(tmp_path), "uri": f"sqlite:///{tmp_path}/./catalog.db"}
    alias = streaming_table("alias", alias_catalog, deletionPolicy="Delete")
    alias["spec"]["table"]["name"] = "dropme"
    tables = ensure_tables(lake.pyiceberg(), streaming_table_from_object(owner))
    for obj in (owner, alias):
        api.call("POST", ST, obj)
        wait_for(
            "the driver pod",
            lambda o=obj: api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{o['metadata']['name']}-ingest"),
        )
    uuids = {report_as_the_driver(kube, obj, lake) for obj in (owner, alias)}
    assert uuids == {str(tables[0].metadata.table_uuid)}

    api.call("DELETE", f"{ST}/alias")
    wait_for("the alias to go", lambda: api.get(f"{ST}/alias") is None, timeout=30, details=operator.tail)
    kept = [m for r, m in events(api, "alias") if r == "TableKeptForOwner"]
    assert kept and f"{NAMESPACE}/dropme" in kept[0], events(api, "alias")
    assert lake.pyiceberg().table_exists(("it", "dropme"))

    api.call("DELETE", f"{ST}/dropme")
    jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    job = wait_for(
        "the purge Job", lambda: api.get(f"{jobs}/dropme-purge"), timeout=30, details=operator.tail
    )
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["serviceAccountName"] == "icefall-dropme-driver" and pod["restartPolicy"] == "Never"
    assert container["command"][:2] == ["icefall", "purge"] and "--table-uuid" in container["command"]
    # The Job controller and the kubelet, played: run the Job's command, then say it completed.
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PYTHONPATH": str(REPO / "operator" / "src")}
    done = subprocess.run([sys.executable, "-m", "icefall.cli", *container["command"][1:]], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    complete = {"type": "Complete", "status": "True", "lastTransitionTime": now}
    met = {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now}
    api.call("PATCH", f"{jobs}/dropme-purge/status", {"status": {
        "startTime": now, "completionTime": now, "succeeded": 1, "conditions": [met, complete],
    }}, content_type="application/merge-patch+json")  # fmt: skip
    wait_for(
        "the StreamingTable to go", lambda: api.get(f"{ST}/dropme") is None, timeout=30, details=operator.tail
    )
    catalog = lake.pyiceberg()
    assert not catalog.table_exists(("it", "dropme")) and not catalog.table_exists(("it", "dropme_dlq"))
    dropped = [m for r, m in events(api, "dropme") if r == "TableDropped"]
    assert dropped and "it.dropme" in dropped[0], events(api, "dropme")


def test_purge_refuses_a_table_that_is_not_the_recorded_one(tmp_path: Path) -> None:
    from icefall.cli import main
    from icefall.plan.purge import EXIT_REFUSED

    obj = streaming_table("local", sqlite_catalog(tmp_path))
    manifest = tmp_path / "table.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    st = load_manifest(manifest)
    lake = CatalogConfig.for_table(st.spec)
    tables = ensure_tables(lake.pyiceberg(), st)
    table, dead_letter_table = tables
    real = str(table.metadata.table_uuid)
    other = "00000000-0000-0000-0000-000000000000"
    assert main(["purge", "-f", str(manifest), "--table-uuid", other]) == EXIT_REFUSED
    assert lake.pyiceberg().table_exists(("it", "local"))  # nothing dropped, not even the dead letters
    assert lake.pyiceberg().table_exists(("it", "local_dlq"))
    assert dead_letter_table is not None
    dead_letters = str(dead_letter_table.metadata.table_uuid)
    assert (
        main(["purge", "-f", str(manifest), "--table-uuid", real, "--dead-letter-table-uuid", dead_letters])
        == 0
    )
    assert not lake.pyiceberg().table_exists(("it", "local"))
    assert not lake.pyiceberg().table_exists(("it", "local_dlq"))
