"""The user path of docs/cluster.md ("In a cluster"), run as a user runs it, with the files a user has.

One module for both harnesses, chosen by ICEFALL_E2E_KUBECONFIG (the `harness` fixture; everything that
differs is in its `Harness`): unset, the e2e's one-node cluster described below; set (hack/kind/e2e-kind.sh,
`make e2e-kind`), the kind cluster of that kubeconfig. The tests and their assertions are the same on both.

What a user does, and what runs for it on the e2e's cluster (`icefall.devstack.cluster`: kube-apiserver,
kube-controller-manager, kube-scheduler and a node of containerd + runc + the real kubelet):
- `icefall run -f examples/cluster.yaml` on a workstation (the secrets in the variables the file's comment
  names): Spark `local[1]` fills the table in the REST catalog, its files in the object store;
- `helm install icefall charts/icefall -f examples/cluster-values.yaml --set image.repository=...
  --set image.tag=...` with the image hack/build-image.sh built here: the Deployment controller makes a
  ReplicaSet, the ReplicaSet controller the Pod, the scheduler binds it, and the node runs it as a
  container of that image (`icefall operator --namespace=... --leader-elect ...`, uid 10001, read-only
  root) with the Pod's projected ServiceAccount token, so the chart's RBAC is all the operator holds; it
  holds none of the catalog's credentials (only the table's pods get the example's Secret, which its
  label grants to StreamingTables); the chart's readiness probe (kopf's /healthz) gates the rollout;
- `kubectl apply -f examples/cluster.yaml` (the Secret and the StreamingTable): the operator starts the
  driver Pod, a container on the node, which goes on from the offsets `icefall run` committed;
- compaction: small batches leave small files, the driver (reading the table with the Secret's
  credentials) reports the backlog, the operator scales the compaction Deployment from that report, the
  controllers make its Pod, the node runs it, and it rewrites them;
- `kubectl get st orders` shows READY True, a FRESHNESS and LAG 0.

Proves: every row produced is in the table (or its dead-letter table) exactly once, readable by pyiceberg
from the object store (every data file is under the example's `s3://lake/warehouse`) and by Spark: every
event has the same day, so the compaction Pod (made by the ReplicaSet controller, not by the test) reads
every row of the table with Spark from the object store and writes them back, and pyiceberg then reads the
same rows; `kubectl get st` shows the table Ready, fresh and caught up; the operator's container ran the
whole path without a restart (its liveness probe never failed) and logged no traceback and no 403.

The example is used as written except its endpoints: `kafka-bootstrap.kafka:9092`,
`http://iceberg-rest.lake:8181` and `http://minio.lake:9000` are cluster DNS names that do not resolve
here, so `with_endpoints` replaces exactly those three values by the loopback addresses of the test's
servers and asserts the rest of the file is byte-identical. `icefall run` and the test's own clients use
that file on both harnesses; the e2e cluster's pods too (they run on the host network, where the servers
listen on loopback), while kind's pods get the example as it is. Everything else is the example's: the
topic `orders`, the table `shop.orders`, the catalog name `lake`, the warehouse `s3://lake/warehouse`, and
the Secret's values — the object store runs with the Secret's `change-me` keys as its root credentials,
and the REST catalog (Iceberg's own REST server, on a PostgreSQL database of its own, files in that object
store) grants the OAuth2 client credentials `client-id:client-secret` a token, as its test server grants
any. The values file is used as written plus what only a test needs: Spark `local[1]` in the driver pod
(`spark.master`; Spark-on-Kubernetes executors are another module's subject), short operator intervals,
and what the e2e cluster needs (`icefall.testing.harness.local_chart_values`): no pod network there, so
`hostNetwork` for the operator, `pods.common` (host network, the API server's loopback address, small
CPU requests) for every table pod, that address in `extraEnv`, and free ports of this machine for the
operator's health and metrics endpoints.

On kind (never run on the machines that run `make test`: they have no Docker), the same steps run with
the cluster's Kafka, MinIO and REST catalog (hack/kind/*.yaml, under the example's Service names), reached
from this process through `kubectl port-forward` (icefall.testing.harness); `icefall run` runs on this
machine through those forwards; the chart is installed with hack/kind/values.yaml's image instead of the
local-only settings (Spark keeps the chart's `k8s://` master, so executors are pods); pod logs come from
`kubectl logs`.

Not proven here: Spark executors as pods on the e2e cluster (test_spark_on_kubernetes.py), a hung
operator restarted by its probes (test_operator_pod.py), several operator replicas (leader election has
its own tests), deletion of the StreamingTable, or a PostgreSQL catalog (test_streaming_table.py runs
that one).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.table import Table

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.procs import tail
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.plan.env import secret_env_vars
from icefall.plan.maintenance_items import MaintenancePolicy
from icefall.plan.names import (
    COMPONENT_COMPACT,
    COMPONENT_INGEST,
    LABEL_COMPONENT,
    LABEL_STREAMINGTABLE,
    compaction_name,
)
from icefall.testing.harness import (
    Helm,
    KafkaAt,
    PortForward,
    e2e_kubeconfig,
    image_args,
    kind_forwards,
    local_chart_values,
    on_loopback,
)
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import Broker, assert_exactly_once, produce, watermarks

from .conftest import REPO, Kubectl, NodeView, pod_logs, replace_snapshots_on_main, table_rows, wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "cluster.yaml"
VALUES = REPO / "examples" / "cluster-values.yaml"
KIND_VALUES = REPO / "hack" / "kind" / "values.yaml"  # the image hack/kind/e2e-kind.sh loads
CHART = REPO / "charts" / "icefall"
RELEASE = "icefall"  # the docs' `helm install icefall charts/icefall`: objects named `icefall`
#: The example's endpoints: cluster DNS names (and ports) of Kafka, the REST catalog and the object store.
KAFKA, REST, S3 = "kafka-bootstrap.kafka:9092", "http://iceberg-rest.lake:8181", "http://minio.lake:9000"
GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
BAD_EVERY = 45
MIN_FILES = MaintenancePolicy().min_files_to_compact
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},{LABEL_COMPONENT}=operator"
COMPACTION_SELECTOR = f"{LABEL_COMPONENT}={COMPONENT_COMPACT}"
Obj = dict[str, Any]


def with_endpoints(text: str, endpoints: Mapping[str, str]) -> str:
    """`text` with each endpoint (a key of `endpoints`, which must occur exactly once) replaced by its value;
    asserts that nothing else changed: mapping the values back gives `text` byte for byte, and only as
    many lines differ as there are endpoints."""
    mapped = text
    for old, new in endpoints.items():
        assert text.count(old) == 1, f"{old!r} should occur once in the example"
        assert new not in text, f"{new!r} is already in the example"
        mapped = mapped.replace(old, new)
    restored = mapped
    for old, new in endpoints.items():
        restored = restored.replace(new, old)
    assert restored == text
    old_lines, new_lines = text.splitlines(keepends=True), mapped.splitlines(keepends=True)
    assert len(old_lines) == len(new_lines)
    assert sum(a != b for a, b in zip(old_lines, new_lines, strict=True)) == len(endpoints)
    return mapped


@dataclass(frozen=True)
class Harness:
    """What differs between the local harness and a real cluster (ICEFALL_E2E_KUBECONFIG set); the tests
    below are the same on both."""

    kafka: KafkaBroker | KafkaAt  # the broker, at the address this process reaches it
    reach: Mapping[str, str]  # each endpoint of the example → the address this process reaches it at
    pods_resolve_the_example: bool  # kind's pods do; the e2e cluster's run on this host's network
    values: Obj  # Helm values only this harness needs (its `extraEnv` goes after the example's)
    install_args: list[str]  # more `helm install` arguments (the e2e cluster's image: `--set image.*`)
    pod_log: Callable[[str], str]  # a pod's log (its tail), for failure messages
    details: Callable[[], str]  # what else to show on failure


@dataclass
class UserPath:
    """The example as applied here and what the tests share."""

    manifest: Path  # examples/cluster.yaml with the endpoints this process reaches
    applied: Path  # what `kubectl apply` gets: the example as it is (kind), or `manifest`
    st: StreamingTable
    secret: Mapping[str, str]  # the example Secret's stringData
    env: Mapping[str, str]  # ICEFALL_CATALOG_* → value: what `icefall run` and the pods read
    catalog: CatalogConfig  # the test's own client of the example's catalog
    kafka: Broker
    namespace: str
    rest: JsonApi
    kubectl: Kubectl
    started: float = field(default_factory=time.monotonic)
    produced: int = 0
    bad: set[tuple[int, int]] = field(default_factory=set)

    @property
    def topic(self) -> str:
        return self.st.spec.source.topic

    @property
    def name(self) -> str:
        return self.st.metadata.name

    @property
    def table_namespace(self) -> str:
        return self.st.spec.table.namespace

    @property
    def table_name(self) -> str:
        return self.st.spec.table.name

    def note(self, what: str) -> None:
        print(f"[e2e +{time.monotonic() - self.started:5.1f}s] {what}", flush=True)

    def produce(self, count: int) -> None:
        self.bad |= produce(self.kafka, self.topic, self.produced, count, bad_every=BAD_EVERY)
        self.produced += count

    def table(self) -> Table | None:
        catalog = self.catalog.pyiceberg()
        identifier = (self.table_namespace, self.table_name)
        return catalog.load_table(identifier) if catalog.table_exists(identifier) else None

    def committed(self) -> dict[int, int]:
        table = self.table()
        return dict(read_committed(table).offsets) if table is not None else {}

    def caught_up(self) -> dict[int, int] | None:
        high = watermarks(self.kafka, self.topic)
        return high if sum(high.values()) == self.produced and self.committed() == high else None

    def assert_exactly_once(self, high: Mapping[int, int]) -> None:
        report = assert_exactly_once(
            self.catalog, self.table_name, high, self.bad, bootstrap=self.kafka.bootstrap,
            namespace=self.table_namespace,
        )  # fmt: skip
        assert report is not None and report.ok

    def st_object(self) -> Obj:
        return (
            self.rest.get(f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}") or {}
        )

    def pods(self, selector: str) -> list[Obj]:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        found: list[Obj] = self.rest.call("GET", path, query=[("labelSelector", selector)])["items"]
        return found

    def running(self, selector: str) -> list[Obj]:
        pods = self.pods(selector)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return [p for p in live if (p.get("status") or {}).get("phase") == "Running"]


def _secret_of(text: str) -> dict[str, str]:
    (secret,) = [doc for doc in yaml.safe_load_all(text) if doc["kind"] == "Secret"]
    data: dict[str, str] = secret["stringData"]
    return data


@pytest.fixture(scope="module")
def secret() -> dict[str, str]:
    return _secret_of(EXAMPLE.read_text())


@pytest.fixture(scope="module")
def lake_store(secret: Mapping[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """An object store whose root credentials are the example Secret's keys, with the example's bucket."""
    store = ObjectStore(
        tmp_path_factory.mktemp("lake-store"),
        access_key=secret["access-key-id"],
        secret_key=secret["secret-access-key"],
    ).start()
    warehouse = load_manifest(EXAMPLE).spec.table.catalog
    assert warehouse is not None and warehouse.warehouse is not None
    store.create_bucket(warehouse.warehouse.removeprefix("s3://").split("/")[0])  # `lake`
    yield store
    store.stop()


@pytest.fixture(scope="module")
def lake_catalog(
    lake_store: ObjectStore, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RESTCatalogServer]:
    """Iceberg's REST server on a PostgreSQL database of its own, new tables under the example's warehouse."""
    catalog = load_manifest(EXAMPLE).spec.table.catalog
    assert catalog is not None and catalog.warehouse is not None
    server = RESTCatalogServer.on_postgres(
        tmp_path_factory.mktemp("lake-rest"),
        postgres,
        "user_path",
        warehouse=catalog.warehouse,
        store=lake_store,
    ).start()
    yield server
    server.stop()


def _local_harness(request: pytest.FixtureRequest) -> Harness:
    """The servers are processes here (started now); the session's cluster runs the pods as containers."""
    kafka: KafkaBroker = request.getfixturevalue("kafka")
    store: ObjectStore = request.getfixturevalue("lake_store")
    catalog: RESTCatalogServer = request.getfixturevalue("lake_catalog")
    cluster: LocalCluster = request.getfixturevalue("cluster")
    node: NodeView = request.getfixturevalue("node")
    return Harness(
        kafka=kafka,
        reach={KAFKA: kafka.bootstrap, REST: catalog.uri, S3: store.endpoint},
        pods_resolve_the_example=False,
        # Spark-on-Kubernetes executors are test_spark_on_kubernetes.py's subject.
        values={"spark": {"master": "local[1]"}, **local_chart_values(cluster)},
        install_args=image_args(cluster.images.icefall),
        pod_log=lambda name: pod_logs(node, name),
        details=lambda: (
            f"--- controller-manager\n{tail(cluster.controller_manager.log_path, 20)}\n"
            f"--- kubelet\n{cluster.node.kubelet.log_tail(20)}"
        ),
    )


@pytest.fixture(scope="module")
def harness(
    request: pytest.FixtureRequest,
    kubectl: Kubectl,
    e2e_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    """The e2e's cluster, or with ICEFALL_E2E_KUBECONFIG the cluster hack/kind/e2e-kind.sh prepared: its
    Kafka, REST catalog and object store reached through `kubectl port-forward`, pods run by its nodes."""
    if e2e_kubeconfig() is None:
        yield _local_harness(request)
        return
    logs = tmp_path_factory.mktemp("port-forward")
    forwards = kind_forwards(KAFKA, [REST, S3])
    running: list[PortForward] = []
    try:
        for forward in forwards.values():
            log = logs / f"{forward.service}.log"
            running.append(PortForward([kubectl.binary], kubectl.env, forward, log).start())
        reach = {
            endpoint: on_loopback(endpoint, forward.local_port) for endpoint, forward in forwards.items()
        }
        yield Harness(
            kafka=KafkaAt(reach[KAFKA]),
            reach=reach,
            pods_resolve_the_example=True,
            values=yaml.safe_load(KIND_VALUES.read_text()),
            install_args=[],
            pod_log=lambda name: (
                f"--- {name}\n" + kubectl("-n", e2e_namespace, "logs", name, "--tail=60", check=False)
            ),
            details=lambda: kubectl("-n", e2e_namespace, "get", "pods,events", check=False),
        )
    finally:
        for forward_process in running:
            forward_process.stop()


@pytest.fixture(scope="module")
def user_path(  # noqa: PLR0917 (fixtures)
    secret: dict[str, str],
    harness: Harness,
    e2e_namespace: str,
    rest: JsonApi,
    kubectl: Kubectl,
    tmp_path_factory: pytest.TempPathFactory,
) -> UserPath:
    manifest = tmp_path_factory.mktemp("example") / "cluster.yaml"
    manifest.write_text(with_endpoints(EXAMPLE.read_text(), harness.reach))
    st = load_manifest(manifest)
    _, catalog_env, problems = secret_env_vars(st.spec)
    assert problems == []
    env = {ref.name: secret[ref.key] for ref in catalog_env}
    harness.kafka.create_topic(st.spec.source.topic, partitions=2)
    catalog = CatalogConfig.for_table(st.spec, environ=env)
    return UserPath(
        manifest=manifest, applied=EXAMPLE if harness.pods_resolve_the_example else manifest, st=st,
        secret=secret, env=env, catalog=catalog, kafka=harness.kafka, namespace=e2e_namespace, rest=rest,
        kubectl=kubectl,
    )  # fmt: skip


def data_files(table: Table) -> list[str]:
    return [task.file.file_path for task in table.scan().plan_files()]


def files_per_partition(table: Table) -> Counter[str]:
    return Counter(str(task.file.partition) for task in table.scan().plan_files())


def test_icefall_run_fills_the_table_from_the_same_file(
    user_path: UserPath, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = user_path
    path.produce(150)
    workdir = tmp_path_factory.mktemp("icefall-run")
    command = [
        sys.executable, "-m", "icefall.cli", "run", "-f", str(path.manifest), "--until-caught-up",
        "--master", "local[1]", "--state-dir", str(workdir / "state"),
    ]  # fmt: skip
    started = time.monotonic()
    log = workdir / "icefall-run.log"
    with log.open("wb") as out:
        done = subprocess.run(
            command, env={**os.environ, **path.env}, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
            timeout=600, check=False,
        )  # fmt: skip
    path.note(f"icefall run -f: exit {done.returncode} after {time.monotonic() - started:.1f}s")
    assert done.returncode == 0, tail(log, 60)
    high = path.caught_up()
    assert high is not None, (path.committed(), watermarks(path.kafka, path.topic), tail(log, 60))
    path.assert_exactly_once(high)
    table = path.table()
    assert table is not None
    catalog = path.st.spec.table.catalog
    assert catalog is not None and catalog.warehouse is not None
    files = data_files(table)
    assert files and all(f.startswith(f"{catalog.warehouse}/") for f in files), files
    path.note(f"{sum(high.values())} records in {len(files)} data files under {catalog.warehouse}")
    # Nothing of the catalog or the table was written on this machine's disk: the state dir holds leases.
    assert not list((workdir / "state").rglob("*.parquet")), list((workdir / "state").rglob("*"))


def _values_file(tmp: Path, harness: Harness) -> Path:
    """examples/cluster-values.yaml plus what only the test (and its harness) needs: see the docstring."""
    values: Obj = yaml.safe_load(VALUES.read_text())
    more = dict(harness.values)
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "ICEFALL_RESYNC_SECONDS", "value": "2"},
        {"name": "ICEFALL_STATUS_SECONDS", "value": "1"},
        {"name": "ICEFALL_STATUS_REFRESH_SECONDS", "value": "2"},
        *more.pop("extraEnv", []),
    ]
    values.update(more)
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _printed_row(kubectl: Kubectl, namespace: str, name: str) -> dict[str, str]:
    """`kubectl get st <name>` as the user sees it: header → value of the one row."""
    header, row = kubectl("-n", namespace, "get", "st", name).rstrip().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


# Two Spark starts (the driver's and the compaction pod's): minutes each on a loaded 2-core machine.
@pytest.mark.timeout(1500)
def test_helm_install_and_kubectl_apply_run_the_pipeline_with_compaction(
    user_path: UserPath, harness: Harness, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = user_path
    namespace = path.namespace
    kubectl = path.kubectl

    def operator_log() -> str:
        pods = path.pods(OPERATOR_SELECTOR)
        return harness.pod_log(pods[-1]["metadata"]["name"]) if pods else "(no operator pod)"

    def explain() -> str:
        status = yaml.safe_dump(path.st_object().get("status"))
        compaction = [p["metadata"]["name"] for p in path.pods(COMPACTION_SELECTOR)]
        more = "\n".join(harness.pod_log(name) for name in compaction)
        return (
            f"--- status\n{status}{harness.pod_log(f'{path.name}-ingest')}\n{more}\n--- operator\n"
            f"{operator_log()}\n{harness.details()}"
        )

    home = tmp_path_factory.mktemp("helm-home")
    path.started = time.monotonic()
    values = _values_file(home, harness)
    helm = Helm(kubeconfig, home)
    helm("install", RELEASE, str(CHART), "-n", namespace, "-f", str(values), *harness.install_args)
    path.note(f"helm install done {' '.join(harness.install_args)}")
    kubectl("-n", namespace, "apply", "-f", str(path.applied))
    path.note("kubectl apply -f examples/cluster.yaml done")

    # The Deployment becomes a ReplicaSet and a Pod (the controllers), which the node runs as a container;
    # the rollout is complete once the readiness probe (kopf's /healthz) passes.
    kubectl("-n", namespace, "rollout", "status", f"deployment/{RELEASE}", "--timeout=300s")
    (operator_pod,) = path.running(OPERATOR_SELECTOR)
    (owner,) = operator_pod["metadata"]["ownerReferences"]
    assert owner["kind"] == "ReplicaSet", owner
    (container,) = operator_pod["spec"]["containers"]
    assert "command" not in container, container  # the image's entry point (tini) stays PID 1
    assert container["args"][:2] == ["icefall", "operator"], container
    (status,) = operator_pod["status"]["containerStatuses"]
    assert status["ready"] and status["containerID"], status
    image = container["image"]
    assert image.endswith(status["image"]) or status["image"].endswith(image), (image, status["image"])
    path.note(f"operator pod {operator_pod['metadata']['name']} running {image} (made by {owner['name']})")

    driver = wait_for(
        "the driver pod running",
        lambda: path.running(f"{LABEL_STREAMINGTABLE}={path.name},{LABEL_COMPONENT}={COMPONENT_INGEST}"),
        timeout=120,
        details=explain,
    )[0]
    path.note(f"driver pod {driver['metadata']['name']} running")

    # Small batches, each committed before the next is produced: small files in one day partition (every
    # event has the same `ts`), until there are enough to compact. The first wait includes Spark's start.
    for round_ in range(8):
        path.produce(30)
        wait_for(
            "the driver to catch up", path.caught_up, timeout=480 if round_ == 0 else 240, details=explain
        )
        table = path.table()
        assert table is not None
        before_files = files_per_partition(table)
        path.note(f"driver caught up with {path.produced} records; files per partition {dict(before_files)}")
        if max(before_files.values()) >= MIN_FILES:
            break
    high = path.caught_up()
    assert high is not None
    path.assert_exactly_once(high)
    before_rows = table_rows(table)
    before_paths = set(data_files(table))
    hot, hot_files = before_files.most_common(1)[0]
    assert hot_files >= MIN_FILES, f"small batches left only {dict(before_files)}: nothing to compact"

    # The driver measures the backlog (with the Secret's credentials; the operator holds none) and
    # reports it; the operator scales the compaction Deployment on that report; the controller-manager
    # makes the Pod; the kubelet runs it; it compacts.
    deployment = compaction_name(path.name)
    replaced = wait_for(
        "a replace snapshot on main", lambda: (t := path.table()) and replace_snapshots_on_main(t),
        timeout=480, every=2, details=explain,
    )  # fmt: skip
    path.note(f"replace snapshot(s) {replaced} on main")
    compactors = path.pods(COMPACTION_SELECTOR)
    assert compactors, explain()
    for pod in compactors:
        (ref,) = pod["metadata"]["ownerReferences"]
        assert ref["kind"] == "ReplicaSet" and ref["name"].startswith(f"{deployment}-"), ref
    table = path.table()
    assert table is not None
    after_files = files_per_partition(table)
    path.note(f"files per partition after: {dict(after_files)}")
    assert after_files[hot] < hot_files, (dict(before_files), dict(after_files))
    assert table_rows(table) == before_rows, "compaction changed the rows"
    # Every data file is new: Spark in the compaction pod read every row from the object store.
    assert not set(data_files(table)) & before_paths, (before_paths, data_files(table))
    path.assert_exactly_once(high)
    catalog = path.st.spec.table.catalog
    assert catalog is not None and catalog.warehouse is not None
    files = data_files(table)
    assert all(f.startswith(f"{catalog.warehouse}/") for f in files), files

    def ready_row() -> dict[str, str] | None:
        row = _printed_row(kubectl, namespace, path.name)
        shown = row.get("READY") == "True" and row.get("FRESHNESS") and row.get("LAG") == "0"
        return row if shown and row.get("FILES") == str(len(files)) else None

    row = wait_for(
        f"kubectl get st: READY True, a FRESHNESS, LAG 0, FILES {len(files)}",
        ready_row,
        timeout=120,
        every=1,
        details=lambda: f"{kubectl('-n', namespace, 'get', 'st')}{explain()}",
    )
    path.note(f"kubectl get st: {row}")
    assert float(row["FRESHNESS"]) <= path.st.spec.freshness.target_seconds, row
    log = operator_log()
    assert "Traceback" not in log, log
    assert not re.search(r"forbidden|\(403\)", log, re.IGNORECASE), log
    # The same operator container ran the whole path: its probes passed all along (no restart).
    (now,) = path.pods(OPERATOR_SELECTOR)
    assert now["metadata"]["uid"] == operator_pod["metadata"]["uid"], "the operator pod was replaced"
    (status,) = now["status"]["containerStatuses"]
    assert status["restartCount"] == 0 and status["ready"], status
