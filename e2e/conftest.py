"""The e2e harness: the operator as a process, the local kubelet, kubectl, all against the session's stack.

Fixtures (module scope unless said otherwise; the stack itself — `kube`, `kafka` — is the session's):
- `kubeconfig`: the switch between harnesses: the cluster of ICEFALL_E2E_KUBECONFIG (`make e2e-kind`;
  only test_user_path.py supports it), else the local API server's admin kubeconfig; `kubectl`, `api`,
  `rest` and `e2e_namespace` work on either;
- `e2e_namespace`: the CRD applied and a namespace of the module's own, so modules never see each other's
  objects (there is no garbage collector to clean up after a module: see e2e/README.md);
- `kubectl`: the real kubectl built next to kube-apiserver, with that kubeconfig;
- `kubelet` (local harness only: it fails with ICEFALL_E2E_KUBECONFIG set, and so does `operator`, which
  needs it): `icefall.testing.kubelet.LocalKubelet` running that namespace's Pods with this venv and this
  checkout as the image, each pod in its own mount namespace: read-only root, its volumes at their mount
  paths, none of the test's temporary folders visible;
- `lake`: the module's Iceberg catalog, reached by pods only over the network, as in a cluster: a
  PostgreSQL JDBC catalog (a database of its own on the session's server) with the table files in the
  session's object store (a bucket of its own), credentials in a Secret `lake` referenced by
  `secretProperties`;
- `operator`: `icefall operator --namespace <ns>` in a subprocess with Spark in the driver pod
  (`ICEFALL_SPARK_MASTER=local[1]`) and short resync/status intervals; it holds no table credential (the
  tables' status comes from their drivers' reports, and compaction is scaled on them).
Teardown order matters: the operator stops before the kubelet, so a driver killed at the end of a module
is not reported as a failure to a live operator.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, ancestors_of

from icefall.api.crd import CRD_NAME
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.cluster import LocalCluster, image_refs
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.node import Node
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.testing.e2e import Kubectl, Lake, Operator, make_lake, wait_for
from icefall.testing.harness import E2E_KUBECONFIG, e2e_kubeconfig
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import NAMESPACE as TABLE_NAMESPACE
from icefall.testing.streams import produce, watermarks

REPO = Path(__file__).resolve().parents[1]
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    """The switch between the harnesses: the cluster of ICEFALL_E2E_KUBECONFIG (`make e2e-kind`), else the
    local harness's API server (started only then), as its admin user."""
    cluster = e2e_kubeconfig()
    if cluster is not None:
        return cluster
    kube: KubeAPIServer = request.getfixturevalue("kube")
    return kube.kubeconfig


def local_harness_only() -> None:
    """Fails a fixture that only the local harness has (the local kubelet, the operator as a process)."""
    if e2e_kubeconfig() is not None:
        pytest.fail(f"this test runs on the local harness only: unset {E2E_KUBECONFIG}")


@pytest.fixture(scope="module")
def kubectl(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(kubeconfig, home=tmp_path_factory.mktemp("kubectl-home"))


@pytest.fixture(scope="module")
def e2e_namespace(request: pytest.FixtureRequest, kubectl: Kubectl) -> Iterator[str]:
    namespace: str = "e2e-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace(
        "_", "-"
    )
    kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    # Right after the apply, `kubectl wait` can fail on a CRD that has no status.conditions yet: retry.
    wait_for(
        "the CRD to be Established",
        lambda: (
            kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s", check=False)
            .strip()
            .endswith("condition met")
        ),
        timeout=60,
    )
    kubectl("create", "namespace", namespace)
    yield namespace
    # The namespace controller stops the module's pods and removes what it left.
    kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def api(kubeconfig: Path) -> client.ApiClient:
    made: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return made


@pytest.fixture(scope="module")
def rest(api: client.ApiClient) -> JsonApi:
    """The API as plain JSON, admin user (objects read as the server sends them)."""
    return JsonApi(api)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The e2e's cluster: its own API server, controller-manager, scheduler and a node on containerd, with
    the image hack/build-image.sh built (every pod is a container from it)."""
    started = time.monotonic()
    running = LocalCluster(tmp_path_factory.mktemp("cluster"), image_refs()).start()
    print(f"[e2e] cluster running in {time.monotonic() - started:.1f}s", flush=True)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> KubeAPIServer:
    """In e2e/, the API server is the cluster's (integration tests keep the plain one)."""
    return cluster.api


@dataclass(frozen=True)
class NodeView:
    """The cluster's node as one module sees it: container logs of its namespace's pods."""

    node: Node
    namespace: str

    def log(self, pod: str, uid: str | None = None) -> str:
        """The text of Pod `pod`'s container logs (`uid`: that incarnation of the name), '' if none yet."""
        return self.node.pod_log(self.namespace, pod, uid)


@pytest.fixture(scope="module")
def node(cluster: LocalCluster, e2e_namespace: str) -> NodeView:
    local_harness_only()
    return NodeView(cluster.node, e2e_namespace)


@pytest.fixture(scope="module")
def lake(e2e_namespace: str, rest: JsonApi, postgres: PostgresServer, object_store: ObjectStore) -> Lake:
    """The module's catalog (`icefall.testing.e2e.make_lake`)."""
    return make_lake(e2e_namespace, rest, postgres, object_store)


@pytest.fixture(scope="module")
def operator(  # noqa: PLR0917 (fixtures)
    request: pytest.FixtureRequest,
    cluster: LocalCluster,
    node: NodeView,
    lake: Lake,
    e2e_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    """The operator (holding none of the lake's credentials: the tables' own pods read them), plus the
    module's `OPERATOR_ENV` (its settings) if any."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    settings: Mapping[str, str] = getattr(request.module, "OPERATOR_ENV", {})
    pods = json.dumps({"common": cluster.pod_template()})
    env = {
        "ICEFALL_IMAGE": cluster.images.icefall,
        "ICEFALL_POD_TEMPLATE": pods,
        **settings,
    }
    running = Operator(cluster.api, e2e_namespace, log, env=env)
    running.start()
    yield running
    running.stop()


def pod_logs(node: NodeView, name: str) -> str:
    """The tail of the newest container log of Pod `name`, for failure messages."""
    text = node.log(name)
    return f"--- pod {name}\n" + "\n".join(text.splitlines()[-60:]) if text else f"(no log for pod {name})"


class TableStream:
    """A topic the test produces to and the table it fills: what was produced (and which records were bad),
    what the table committed, whether it caught up, and timed milestones for failure messages."""

    def __init__(
        self, kafka: KafkaBroker, catalog: CatalogConfig, *, topic: str, table: str, bad_every: int
    ) -> None:
        self.kafka, self.catalog = kafka, catalog
        self.topic, self.table, self.bad_every = topic, table, bad_every
        self.bad: set[tuple[int, int]] = set()
        self.produced = 0
        self.started = time.monotonic()

    def note(self, what: str) -> None:
        """A milestone with the seconds since the start (pytest shows it on failure)."""
        print(f"[e2e +{time.monotonic() - self.started:5.1f}s] {what}", flush=True)

    def produce(self, count: int) -> None:
        self.bad |= produce(self.kafka, self.topic, self.produced, count, bad_every=self.bad_every)
        self.produced += count

    def committed(self) -> dict[int, int]:
        """The next offset per partition committed to the table (empty before the table exists)."""
        catalog = self.catalog.pyiceberg()
        if not catalog.table_exists((TABLE_NAMESPACE, self.table)):
            return {}
        return dict(read_committed(catalog.load_table((TABLE_NAMESPACE, self.table))).offsets)

    def caught_up(self) -> dict[int, int] | None:
        """The topic's high watermarks once the table committed all of them and all were produced."""
        high = watermarks(self.kafka, self.topic)
        return high if self.committed() == high and sum(high.values()) == self.produced else None


def table_rows(table: Table) -> Counter[str]:
    """The table's rows as a multiset (each row as canonical JSON: some columns are structs)."""
    return Counter(
        json.dumps(row, sort_keys=True, default=str) for row in table.scan().to_arrow().to_pylist()
    )


def replace_snapshots_on_main(table: Table) -> list[int]:
    """Ids of the `replace` (rewrite) snapshots in main's history."""
    current = table.current_snapshot()
    if current is None:
        return []
    return [
        s.snapshot_id
        for s in ancestors_of(current, table.metadata)
        if s.summary is not None and s.summary.operation == Operation.REPLACE
    ]
