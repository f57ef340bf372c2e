"""Helpers for ingestion tests against the real stack: a manifest, a producer, and the exactly-once check.

`assert_exactly_once` is the record-by-record proof every ingestion test ends with: each offset Kafka ever
held below the committed end is in the table or (if malformed) in the dead-letter table exactly once,
unless retention deleted it before it was ingested; the committed offsets are the topic's end; and the
auditor (`icefall.audit`, what `icefall verify` runs) agrees. With a Spark session that has the table's
catalog (passed, or the active one), the auditor compares every row with its Kafka record by content
(`icefall.audit.content`): a row whose value differs from its record fails, naming its offset.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from icefall.api import StreamingTable, load_manifest
from icefall.audit import AuditReport, audit_from_catalog
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.kafka.admin import TopicView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from icefall.audit import SparkContent
    from icefall.ingest.engine import BatchReport, Ingestor

NAMESPACE = "it"


class Broker(Protocol):
    """A Kafka broker as these helpers use it: the test stack's `KafkaBroker`, or a cluster's broker."""

    @property
    def bootstrap(self) -> str: ...


MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {k8s_name}}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  format:
    type: json
    schema:
      - {{name: id, type: long, required: true}}
      - {{name: customer, type: string}}
      - {{name: amount, type: "decimal(10,2)"}}
      - {{name: ts, type: timestamptz, required: true}}
  table: {{namespace: it, name: {name}, partitioning: [{{field: ts, transform: day}}]}}
  freshness: {{targetSeconds: 2}}
"""


def manifest_text(
    name: str,
    topic: str | Sequence[str],
    bootstrap: str,
    *,
    batch: Mapping[str, int | bool] | None = None,
    catalog: Mapping[str, Any] | None = None,
    security: Mapping[str, Any] | None = None,
) -> str:
    """The test manifest for table `it.<name>` (dead letters in `it.<name>_dlq`) filled from `topic` (a
    list: `spec.source.topics`).

    `batch` sets `spec.batch` (camelCase keys: `maxRecords`, `maxRecordsPerPartition`, ...); `catalog` sets
    `spec.table.catalog` (`SharedCatalog.block`; default: the embedded catalog); `security` sets
    `spec.source.security` (camelCase keys, credentials as `{env: NAME}` references).
    """
    if not isinstance(topic, str):
        listed = json.dumps(list(topic))
        text = manifest_text(name, "TOPICS", bootstrap, batch=batch, catalog=catalog, security=security)
        return text.replace("topic: TOPICS", f"topics: {listed}", 1)
    text = MANIFEST.format(name=name, k8s_name=name.replace("_", "-"), bootstrap=bootstrap, topic=topic)
    if security is not None:
        text = text.replace(
            f"topic: {topic}}}", f"topic: {topic}, security: {json.dumps(dict(security))}}}", 1
        )
    if catalog is not None:
        text = text.replace("partitioning: [", f"catalog: {json.dumps(dict(catalog))}, partitioning: [")
    if batch:
        text += f"  batch: {json.dumps(dict(batch))}\n"
    return text


@dataclass(frozen=True)
class SharedCatalog:
    """A `spec.table.catalog` block for a catalog server of the test stack, and the environment holding the
    secrets it references (`{env: ...}`), as `icefall run` and the pods read them."""

    kind: str
    block: Mapping[str, Any]
    env: Mapping[str, str]

    def config(self, st: StreamingTable) -> CatalogConfig:
        return CatalogConfig.for_table(st.spec, environ=self.env)

    @property
    def scheme(self) -> str:
        """The URI scheme of the table files' store: `abfss` (Azurite), `gs` (the GCS emulator), else `s3`."""
        return {"azure": "abfss", "gcs": "gs"}.get(self.kind.rsplit("-", 1)[-1], "s3")


SHARED_CATALOGS = ("postgres-s3", "rest-s3", "postgres-azure", "postgres-gcs")


def shared_catalog(
    request: Any, kind: str, bucket: str = "it-lake", *, name: str = "icefall"
) -> SharedCatalog:
    """`postgres-s3`: Iceberg's JDBC catalog on the `postgres` fixture, files in the `object_store` fixture
    (MinIO); `rest-s3`: Iceberg's REST server `rest_catalog_s3` (on PostgreSQL, files in MinIO) behind
    `rest_catalog_auth`, which checks the OAuth2 client credential (`credential` by `env` reference).
    `request` is the test's pytest request: the servers are its session fixtures. Secrets by `env`
    reference only. `postgres-azure`: the JDBC catalog on `postgres`, files in the `azurite` fixture
    (abfss://). `postgres-gcs`: the JDBC catalog on `postgres`, files in the `gcs` fixture
    (fake-gcs-server), gs://, no storage credentials."""
    if kind == "postgres-azure":
        return _postgres_azure(request, bucket, name)
    if kind == "postgres-gcs":
        return _postgres_gcs(request, bucket, name)
    store = request.getfixturevalue("object_store")
    s3 = store.properties()
    env = {"IT_S3_ACCESS_KEY": s3["s3.access-key-id"], "IT_S3_SECRET_KEY": s3["s3.secret-access-key"]}
    secrets: dict[str, Any] = {
        "s3.access-key-id": {"env": "IT_S3_ACCESS_KEY"},
        "s3.secret-access-key": {"env": "IT_S3_SECRET_KEY"},
    }
    properties = {
        "s3.endpoint": s3["s3.endpoint"],
        "s3.region": s3["s3.region"],
        "s3.path-style-access": "true",
    }
    if kind == "postgres-s3":
        postgres = request.getfixturevalue("postgres")
        store.create_bucket(bucket)
        env["IT_PG_PASSWORD"] = postgres.password
        block = {
            "name": name,
            "type": "sql",
            "uri": f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{postgres.database}",
            "warehouse": f"s3://{bucket}/jdbc",
            "properties": properties,
            "secretProperties": {**secrets, "password": {"env": "IT_PG_PASSWORD"}},
        }
    elif kind == "rest-s3":
        from icefall.testing.plugin import REST_CLIENT_ID, REST_CLIENT_SECRET

        front = request.getfixturevalue("rest_catalog_auth")
        env["IT_REST_CREDENTIAL"] = f"{REST_CLIENT_ID}:{REST_CLIENT_SECRET}"
        block = {
            "name": name,
            "type": "rest",
            "uri": front.uri,
            "properties": {**properties, "oauth2-server-uri": f"{front.uri}/v1/oauth/tokens"},
            "secretProperties": {**secrets, "credential": {"env": "IT_REST_CREDENTIAL"}},
        }
    else:
        raise ValueError(f"unknown shared catalog {kind!r}; one of {SHARED_CATALOGS}")
    return SharedCatalog(kind, block, env)


def _postgres_azure(request: Any, container: str, name: str) -> SharedCatalog:
    """Iceberg's JDBC catalog on `postgres`, table files in Azurite (`abfss://<container>@.../jdbc`); the
    account key by `env` reference, as a real one would be."""
    server = request.getfixturevalue("azurite")
    postgres = request.getfixturevalue("postgres")
    server.create_container(container)
    properties = server.properties()
    env = {"IT_ADLS_KEY": properties.pop("adls.account-key"), "IT_PG_PASSWORD": postgres.password}
    block = {
        "name": name,
        "type": "sql",
        "uri": f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{postgres.database}",
        "warehouse": server.location(container, "jdbc"),
        "properties": properties,
        "secretProperties": {
            "adls.account-key": {"env": "IT_ADLS_KEY"},
            "password": {"env": "IT_PG_PASSWORD"},
        },
    }
    return SharedCatalog("postgres-azure", block, env)


def _postgres_gcs(request: Any, bucket: str, name: str) -> SharedCatalog:
    """Iceberg's JDBC catalog on the `postgres` fixture, table files in the `gcs` emulator. The emulator
    needs no credentials: only the database password is a secret."""
    emulator = request.getfixturevalue("gcs")
    postgres = request.getfixturevalue("postgres")
    emulator.create_bucket(bucket)
    block = {
        "name": name,
        "type": "sql",
        "uri": f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{postgres.database}",
        "warehouse": f"gs://{bucket}/jdbc",
        "properties": emulator.properties(),
        "secretProperties": {"password": {"env": "IT_PG_PASSWORD"}},
    }
    return SharedCatalog("postgres-gcs", block, {"IT_PG_PASSWORD": postgres.password})


REGISTRY_MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {k8s_name}}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  format:
    type: {format_type}
    registry: {{url: "{registry_url}"}}
{schema}
  table: {{namespace: it, name: {name}, partitioning: [{{field: ts, transform: day}}]}}
  freshness: {{targetSeconds: 2}}
"""


def registry_table(
    name: str, topic: str, bootstrap: str, registry_url: str, format_type: str, *, schema: str = ""
) -> StreamingTable:
    """The test manifest for table `it.<name>` (partitioned by day(ts)) of a registry format; `schema`: an
    inline `    schema:` block, if any."""
    return load_manifest(
        REGISTRY_MANIFEST.format(
            name=name,
            k8s_name=name.replace("_", "-"),
            bootstrap=bootstrap,
            topic=topic,
            format_type=format_type,
            registry_url=registry_url,
            schema=schema,
        )
    )


def streaming_table(
    name: str, topic: str | Sequence[str], bootstrap: str, *, batch: Mapping[str, int | bool] | None = None
) -> StreamingTable:
    return load_manifest(manifest_text(name, topic, bootstrap, batch=batch))


def produce(
    kafka: Broker,
    topic: str,
    start: int,
    count: int,
    bad_every: int = 0,
    *,
    partitions: Sequence[int] | None = None,
) -> set[tuple[int, int]]:
    """Produce events `start..start+count-1`, every `bad_every`-th malformed; return the (partition, offset)
    of the bad ones. Keyed by id (the default partitioner spreads them), or round-robin over `partitions`
    when given."""
    from confluent_kafka import Producer

    delivered: list[tuple[int, int, bool]] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        bad = bad_every > 0 and i % bad_every == 0
        value = (
            "{not json"
            if bad
            else json.dumps(
                {"id": i, "customer": f"c{i % 7}", "amount": round(i * 1.25, 2), "ts": "2026-11-22T10:00:00Z"}
            )
        )

        def on_delivery(err: Any, msg: Any, bad: bool = bad) -> None:
            assert err is None, err
            delivered.append((msg.partition(), msg.offset(), bad))

        partition = -1 if partitions is None else partitions[i % len(partitions)]  # -1: the partitioner's
        while True:
            try:
                producer.produce(topic, key=str(i), value=value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full (100,000 records): let deliveries drain it
                producer.poll(0.1)
    assert producer.flush(60) == 0
    assert len(delivered) == count
    return {(p, o) for p, o, bad in delivered if bad}


KEYED_MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {k8s_name}}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  mode: {mode}
  key: [id]{sequence_by}
  format:
    schema:
      - {{name: id, type: long, required: true}}
{fields}
  table: {{namespace: it, name: {name}}}
  freshness: {{targetSeconds: 2}}
"""


def keyed_table(
    name: str,
    topic: str,
    bootstrap: str,
    *,
    mode: str = "upsert",
    fields: Mapping[str, str] | None = None,
    sequence_by: Sequence[str] = (),
) -> StreamingTable:
    """A keyed table `it.<name>` (`spec.mode` upsert or cdc, key `id: long`) with optional `fields`
    (name -> type; default `status: string`) and `sequence_by` (cdc), unpartitioned."""
    lines = [
        f"      - {{name: {n}, type: {json.dumps(t)}}}" for n, t in (fields or {"status": "string"}).items()
    ]
    text = KEYED_MANIFEST.format(
        name=name,
        k8s_name=name.replace("_", "-"),
        bootstrap=bootstrap,
        topic=topic,
        mode=mode,
        sequence_by=f"\n  sequenceBy: {json.dumps(list(sequence_by))}" if sequence_by else "",
        fields="\n".join(lines),
    )
    return load_manifest(text)


Change = tuple[int | None, Any, Any]  # (partition or None for the default partitioner, Kafka key, value)


def send_changes(kafka: Broker, topic: str, changes: Iterable[Change]) -> None:
    """Produce `changes` in order (a None value is a tombstone); keys and values that are not bytes or str
    are sent as JSON."""
    from confluent_kafka import Producer

    def encoded(x: Any) -> Any:
        return None if x is None else x if isinstance(x, str | bytes) else json.dumps(x)

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for partition, key, value in changes:
        if partition is None:
            producer.produce(topic, key=encoded(key), value=encoded(value))
        else:
            producer.produce(topic, key=encoded(key), value=encoded(value), partition=partition)
    assert producer.flush(30) == 0


@contextmanager
def started_ingestor(
    st: StreamingTable, config: CatalogConfig, spark: SparkSession, lease_path: Path, **kwargs: Any
) -> Iterator[Ingestor]:
    """An Ingestor of `st` holding a file commit lease at `lease_path`, started, closed on exit."""
    from icefall.commit.lease import FileLease
    from icefall.ingest.engine import Ingestor

    ingestor = Ingestor(st, config, spark, FileLease(lease_path, "w"), **kwargs)
    ingestor.start(lease_timeout=10)
    try:
        yield ingestor
    finally:
        ingestor.close()


def drain(ingestor: Ingestor, max_batches: int = 50) -> list[BatchReport]:
    """Run batches until there is nothing left to read; the reports of those that committed."""
    reports = []
    while (report := ingestor.run_batch()) is not None:
        reports.append(report)
        assert len(reports) <= max_batches, f"not caught up after {max_batches} batches"
    return reports


def watermarks(kafka: Broker, topic: str) -> dict[int, int]:
    """The high watermark (next offset) of every partition of `topic`."""
    with TopicView(kafka.bootstrap, topic) as view:
        return {p: high for p, (_, high) in view.watermarks().items()}


def recreate_topic(kafka: Any, topic: str, *, partitions: int = 1, timeout: float = 60) -> None:
    """Delete `topic` and create it again (empty, a new topic id) as soon as Kafka has finished deleting it."""
    import time

    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})  # kept alive: its futures need its handle
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + timeout
    while True:
        try:
            kafka.create_topic(topic, partitions=partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def table_offsets(
    config: CatalogConfig, name: str, namespace: str = NAMESPACE
) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    """How many times each (partition, offset) is in table `<namespace>.<name>` (default `it`) and in
    `<namespace>.<name>_dlq`."""
    import pyarrow.compute as pc

    catalog = config.pyiceberg()
    rows = catalog.load_table((namespace, name)).scan(selected_fields=("_kafka",)).to_arrow()
    kafka = rows.column("_kafka").combine_chunks()
    partitions = pc.struct_field(kafka, "partition").to_pylist()
    main = Counter(zip(partitions, pc.struct_field(kafka, "offset").to_pylist(), strict=True))
    dlq_rows = (
        catalog.load_table((namespace, f"{name}_dlq"))
        .scan(selected_fields=("partition", "offset"))
        .to_arrow()
    )
    dlq = Counter(
        zip(dlq_rows.column("partition").to_pylist(), dlq_rows.column("offset").to_pylist(), strict=True)
    )
    return main, dlq


def content_source(
    config: CatalogConfig,
    name: str,
    bootstrap: str,
    *,
    spark: SparkSession | None = None,
    st: StreamingTable | None = None,
    namespace: str = NAMESPACE,
) -> SparkContent | None:
    """What compares table `<namespace>.<name>` by content: `spark` (default: the active session, if it has
    `config`'s catalog) decoding with `st` (default: the test manifest for the table's topic). None without
    such a session."""
    from icefall.audit import SparkContent

    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        key = f"spark.sql.catalog.{config.name}.uri"
        if spark is None or spark.conf.get(key, None) != config.spark_conf().get(key):
            return None
    if st is None:
        topic = read_committed(config.pyiceberg().load_table((namespace, name))).topic
        if topic is None:
            return None
        st = streaming_table(name, topic, bootstrap)
    return SparkContent(spark, st.spec, config.name)


def audit(
    config: CatalogConfig,
    name: str,
    bootstrap: str,
    namespace: str = NAMESPACE,
    *,
    spark: SparkSession | None = None,
    st: StreamingTable | None = None,
) -> AuditReport:
    """`icefall verify` of table `<namespace>.<name>` and its dead-letter table against the live topic, by
    content when `content_source` finds a Spark session."""
    dead_letter = f"{namespace}.{name}_dlq"
    catalog = config.pyiceberg()
    return audit_from_catalog(
        catalog,
        f"{namespace}.{name}",
        bootstrap,
        dead_letter=dead_letter if catalog.table_exists(dead_letter) else None,
        content=content_source(config, name, bootstrap, spark=spark, st=st, namespace=namespace),
    )


def assert_exactly_once(  # noqa: PLR0913 (keyword-only test settings)
    config: CatalogConfig,
    name: str,
    high: Mapping[int, int],
    bad: Set[tuple[int, int]],
    *,
    lost: Set[tuple[int, int]] = frozenset(),
    bootstrap: str | None = None,
    namespace: str = NAMESPACE,
    spark: SparkSession | None = None,
    st: StreamingTable | None = None,
) -> AuditReport | None:
    """Every offset below `high` (per partition) is in the table `<namespace>.<name>`, or in the DLQ if it is
    in `bad`, exactly once, except the `lost` ones (deleted by retention before ingestion: in neither); the
    table's committed offsets are `high`. With `bootstrap`, the auditor must agree too, by content when a
    Spark session is at hand (`content_source`); its report is returned."""
    main, dlq = table_offsets(config, name, namespace)
    expected = {(p, o) for p, end in high.items() for o in range(end)} - set(lost)
    assert max(main.values(), default=1) == 1, (
        f"duplicates in table: {[k for k, n in main.items() if n > 1][:10]}"
    )
    assert max(dlq.values(), default=1) == 1, (
        f"duplicates in DLQ: {[k for k, n in dlq.items() if n > 1][:10]}"
    )
    assert not set(main) & set(dlq), f"in table and DLQ: {sorted(set(main) & set(dlq))[:10]}"
    assert set(dlq) == set(bad) - set(lost), (
        f"DLQ differs: extra {sorted(set(dlq) - set(bad))[:10]}, missing {sorted(set(bad) - set(dlq))[:10]}"
    )
    assert set(main) == expected - set(bad), (
        f"table differs: extra {sorted(set(main) - expected)[:10]}, "
        f"missing {sorted(expected - set(bad) - set(main))[:10]}"
    )
    committed = read_committed(config.pyiceberg().load_table((namespace, name)))
    assert committed.offsets == dict(high)
    if bootstrap is None:
        return None
    report = audit(config, name, bootstrap, namespace, spark=spark, st=st)
    assert report.ok, report.render()
    assert report.duplicates == report.missing == report.unexpected == report.wrong == 0, report.render()
    return report


def assert_exactly_once_by_topic(
    config: CatalogConfig,
    name: str,
    high: Mapping[str, Mapping[int, int]],
    bad: Set[tuple[str, int, int]],
    *,
    bootstrap: str | None = None,
    spark: SparkSession | None = None,
    st: StreamingTable | None = None,
) -> AuditReport | None:
    """`assert_exactly_once` for a table of several topics: every (topic, partition, offset) below `high`
    is in the table, or in the DLQ if it is in `bad`, exactly once; the committed offsets of each topic are
    its `high`; with `bootstrap`, the auditor agrees (by content with `spark` and `st`)."""
    import pyarrow.compute as pc

    catalog = config.pyiceberg()
    kafka = catalog.load_table((NAMESPACE, name)).scan(selected_fields=("_kafka",)).to_arrow()
    column = kafka.column("_kafka").combine_chunks()
    main = Counter(
        zip(*(pc.struct_field(column, f).to_pylist() for f in ("topic", "partition", "offset")), strict=True)
    )
    dead = catalog.load_table((NAMESPACE, f"{name}_dlq")).scan(
        selected_fields=("topic", "partition", "offset")
    )
    rows = dead.to_arrow()
    dlq = Counter(zip(*(rows.column(f).to_pylist() for f in ("topic", "partition", "offset")), strict=True))
    expected = {(t, p, o) for t, ends in high.items() for p, end in ends.items() for o in range(end)}
    assert max(main.values(), default=1) == 1, f"duplicates: {[k for k, n in main.items() if n > 1][:10]}"
    assert max(dlq.values(), default=1) == 1, f"DLQ duplicates: {[k for k, n in dlq.items() if n > 1][:10]}"
    assert set(dlq) == set(bad), (
        f"DLQ: extra {sorted(set(dlq) - bad)[:5]}, missing {sorted(bad - set(dlq))[:5]}"
    )
    missing = expected - set(bad) - set(main)
    assert set(main) == expected - set(bad), (
        f"table: extra {sorted(set(main) - expected)[:5]}, missing {sorted(missing)[:5]}"
    )
    committed = read_committed(catalog.load_table((NAMESPACE, name)))
    assert {t: dict(held.offsets) for t, held in committed.by_topic().items()} == {
        t: dict(ends) for t, ends in high.items()
    }
    if bootstrap is None:
        return None
    report = audit(config, name, bootstrap, spark=spark, st=st)
    assert report.ok, report.render()
    assert report.duplicates == report.missing == report.unexpected == report.wrong == 0, report.render()
    return report


#: The columns of Spark's Kafka source, as a DDL string.
KAFKA_SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


def kafka_source_frame(
    spark: SparkSession,
    values: Sequence[Any],
    *,
    produced: datetime,
    partition: int = 0,
    first_offset: int = 0,
    keyed: bool = True,
) -> DataFrame:
    """`values` as Spark's Kafka source returns them from topic `orders`, at consecutive offsets from
    `first_offset`: dicts JSON-encoded, str UTF-8-encoded, bytes as they are. With `keyed`, record `o` has
    key `k<o>` and one header `trace` = `t-<o>`; without, no key and no headers."""
    rows = []
    for offset, value in enumerate(values, start=first_offset):
        text = json.dumps(value) if isinstance(value, dict) else value
        payload = text.encode() if isinstance(text, str) else text
        key, headers = (b"k%d" % offset, [("trace", b"t-%d" % offset)]) if keyed else (None, [])
        rows.append((key, payload, "orders", partition, offset, produced, 0, headers))
    return spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA)
