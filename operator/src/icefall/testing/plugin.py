"""Session-scoped pytest fixtures for the real test stack: Kafka (one broker; a three-node cluster for the
broker fault tests), kube-apiserver + etcd, Spark + catalog, PostgreSQL, the Iceberg REST catalog server,
an S3 object store (MinIO), a Google Cloud Storage emulator (fake-gcs-server) and a schema registry
(Apicurio).

Each component starts once per run on free loopback ports and is stopped at the end of the run, including
after Ctrl-C; if the run is killed outright, the parent-death signal ends the children. A component that
cannot start fails the tests that need it with the tail of its log: nothing here ever skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from icefall.catalog import CatalogConfig
from icefall.devstack.azurite import Azurite
from icefall.devstack.catalog_auth import CatalogAuthProxy
from icefall.devstack.gcs import GcsEmulator
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kafka_cluster import KafkaCluster
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.procs import STACK_JAVA_OPTIONS
from icefall.devstack.registry import SchemaRegistryServer
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.devstack.tools import tool_dir
from icefall.testing.jvm import C1_ONLY, fast_start, long_lived

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TIERS = ("unit", "integration", "e2e")
#: The tests that use the machine's one node (the e2e tier, the node's own tests): one worker runs them all.
NODE_GROUP = "node"
NODE_GROUP_PATHS = ("e2e/", "tests/integration/test_node_leftovers.py")
SOURCE = Path(__file__).resolve().parents[2]  # operator/src of the checkout under test


def pytest_configure(config: pytest.Config) -> None:
    """`python -m icefall...` processes that tests start import this checkout's code, like the tests do
    (not whatever checkout the virtualenv's editable install points at); the stack's JVMs start cheaply."""
    paths = [str(SOURCE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # The stack's servers live for a run and serve small loads: C1 starts them for about half the CPU.
    os.environ.setdefault(STACK_JAVA_OPTIONS, C1_ONLY)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test belongs to exactly one tier, so `-m unit` really selects the fast ones; the e2e tier lives
    in the node's group (`NODE_GROUP_PATHS`)."""
    for item in items:
        tiers = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid} must be marked with exactly one of {TIERS}, has {tiers}")
        if tiers == ["e2e"] and not item.nodeid.startswith(NODE_GROUP_PATHS):
            raise pytest.UsageError(f"{item.nodeid}: e2e tests live under {NODE_GROUP_PATHS[0]}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Run in parallel (`-n 2 --dist loadgroup`, as `make test` does), each worker starts a stack of its own
    (the fixtures below are per process), and tests are handed out one at a time, except those that share
    the machine's one node (a kubelet on containerd and its cgroups): they run in one worker, one after
    another, and first (the largest unit of work), so the other worker never waits for them at the end.
    (xdist's own `xdist_group` marks do not group under pytest 9.2: they rename a field pytest no longer
    reads.)"""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class NodeGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return NODE_GROUP if nodeid.startswith(NODE_GROUP_PATHS) else nodeid

    return NodeGroupScheduling(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Beyond unit tests, Spark runs (here and in the `icefall` processes tests start), and outside the image
    it finds Icefall's jars through ICEFALL_SPARK_JARS: resolve them now (cached) if `make` has not. Its
    driver JVMs then start cheaply (`icefall.testing.jvm`)."""
    if any(not item.get_closest_marker("unit") for item in session.items):
        jars = tool_dir("ICEFALL_SPARK_JARS")
        fast_start(jars)


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def kafka(stack_dir: Path) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(stack_dir / "kafka").start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_cluster(stack_dir: Path) -> Iterator[KafkaCluster]:
    """Three combined broker + controller nodes (replication factor 3, `min.insync.replicas` 2), started only
    for the broker fault tests that ask for it. A test that kills or stops a node brings it back (`heal`)."""
    cluster = KafkaCluster(stack_dir / "kafka-cluster").start()
    yield cluster
    cluster.stop()


#: The users of `secure_kafka`'s SASL listeners: PLAIN ones, and SCRAM ones (SCRAM-SHA-256 and -512).
PLAIN_USERS = {"icefall": "s3cret"}
SCRAM_USERS = {"icefall-scram": "scram-s3cret"}


@pytest.fixture(scope="session")
def secure_kafka(stack_dir: Path) -> Iterator[KafkaBroker]:
    """A second broker, started only for the tests that ask for it, with a listener per security setup:
    PLAINTEXT (for fixtures: topics, producers), SASL_PLAINTEXT and SASL_SSL (`PLAIN_USERS`,
    `SCRAM_USERS`), SSL and MTLS (client certificate required). Its `tls` is the CA and the certificates,
    made for this run (`icefall.devstack.tls.Pki`)."""
    from icefall.devstack.tls import Pki

    pki = Pki.create(stack_dir / "kafka-secure-pki")
    broker = KafkaBroker(
        stack_dir / "kafka-secure", sasl_users=PLAIN_USERS, scram_users=SCRAM_USERS, tls=pki
    ).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kube(stack_dir: Path) -> Iterator[KubeAPIServer]:
    # "limited" belongs to no group: RBAC tests grant it exactly what it needs.
    server = KubeAPIServer(stack_dir / "kube", users={"limited": ""}).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres(stack_dir: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(stack_dir / "postgres").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rest_catalog(stack_dir: Path) -> Iterator[RESTCatalogServer]:
    """SQLite-backed, warehouse in a local folder; a test that needs S3 or PostgreSQL starts its own."""
    server = RESTCatalogServer(stack_dir / "rest-catalog").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def object_store(stack_dir: Path) -> Iterator[ObjectStore]:
    store = ObjectStore(stack_dir / "objectstore").start()
    yield store
    store.stop()


@pytest.fixture(scope="session")
def azurite(stack_dir: Path) -> Iterator[Azurite]:
    """Azure storage (Azurite's Blob service) for tables on abfss://, development account."""
    server = Azurite(stack_dir / "azurite").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs(stack_dir: Path) -> Iterator[GcsEmulator]:
    """fake-gcs-server: gs:// buckets on loopback, any credentials accepted (`gcs.no-auth`)."""
    emulator = GcsEmulator(stack_dir / "gcs").start()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def rest_catalog_s3(
    stack_dir: Path, object_store: ObjectStore, postgres: PostgresServer
) -> Iterator[RESTCatalogServer]:
    """The shape of a production lake: Iceberg's REST server on a PostgreSQL JDBC catalog, table files in
    the S3 object store (bucket `rest-lake`)."""
    object_store.create_bucket("rest-lake")
    server = RESTCatalogServer.on_postgres(
        stack_dir / "rest-catalog-s3",
        postgres,
        "rest_catalog",
        warehouse="s3://rest-lake/warehouse",
        store=object_store,
    ).start()
    yield server
    server.stop()


#: The one client `rest_catalog_auth` knows: `credential` is `<id>:<secret>` (Iceberg's OAuth2 form).
REST_CLIENT_ID, REST_CLIENT_SECRET = "icefall-it", "it-client-secret"
#: Its tokens' lifetime: long enough for any test here; tests of refresh run a proxy of their own.
REST_TOKEN_TTL = 600.0


@pytest.fixture(scope="session")
def rest_catalog_auth(rest_catalog_s3: RESTCatalogServer) -> Iterator[CatalogAuthProxy]:
    """`rest_catalog_s3` behind an OAuth2 front that checks credentials (icefall.devstack.catalog_auth):
    client credentials `REST_CLIENT_ID`/`REST_CLIENT_SECRET`; the Iceberg fixture alone grants anything."""
    proxy = CatalogAuthProxy(
        rest_catalog_s3.uri, {REST_CLIENT_ID: REST_CLIENT_SECRET}, token_ttl=REST_TOKEN_TTL
    ).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def schema_registry(stack_dir: Path) -> Iterator[SchemaRegistryServer]:
    """Apicurio Registry with in-memory storage and global compatibility BACKWARD; `.url` is its
    Confluent-compatible API. Tests register under subjects of their own (topic names are unique per test):
    the registry is shared by the whole run."""
    server = SchemaRegistryServer(stack_dir / "schema-registry").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def catalog_config(stack_dir: Path) -> CatalogConfig:
    config = CatalogConfig.embedded(stack_dir / "lake")
    config.pyiceberg()  # creates the catalog tables before Spark's JdbcCatalog looks at them
    return config


@pytest.fixture(scope="session")
def spark(catalog_config: CatalogConfig) -> Iterator[SparkSession]:
    from icefall.spark.session import build_spark_session

    with long_lived():
        session = build_spark_session([catalog_config], app_name="icefall-tests")
    yield session
    session.stop()
