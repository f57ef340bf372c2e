"""Outages of Kafka, the object store and the catalog, with the real servers stopped and started again.

Proves, with `icefall run` as a user starts it (a subprocess on local Spark):
- a broker restart (stopped ~20 s, started again on the same port with its data): the process stays up,
  logs one line per failed attempt naming the bootstrap servers and topic and no traceback, shows the
  outage in `icefall_ingest_unavailable` / `icefall_ingest_outages_total`, and after the broker returns
  every record produced before and after lands exactly once (record by record and by the auditor);
- while the broker is down, `icefall status` and `icefall verify` print one line naming the bootstrap
  servers and exit non-zero;
- a table on PostgreSQL (JDBC catalog) with its files in MinIO: the object store stopped ~15 s and then the
  catalog's database stopped ~15 s, records produced during each outage: the same process logs one line per
  attempt naming the object store's endpoint / the catalog's URI, resumes by itself, and every record lands
  exactly once; `icefall status` with the catalog down is one line naming it, exit non-zero;
- a Delta table on S3 (MinIO stopped ~15 s, records produced meanwhile): the same, the lines naming the
  table's location; every record once by content (delta-rs, `icefall verify`);
- (`long`) a table in Google Cloud Storage (fake-gcs-server) or Azure storage (Azurite): the store stopped
  ~15 s, the same (pyiceberg meets the outage first; GCS's retries bounded by icefall.catalog.gcs_io).

Not proven here: an outage that begins in the middle of Spark's Kafka read (the Java consumer waits for the
broker up to its poll timeout, then the batch fails and is planned again; the commit protocol's unknown
outcomes are covered in test_commit_protocol.py); the REST catalog server going away.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commands.delta import verify_delta_table
from icefall.commit import read_committed
from icefall.commit.delta import DeltaLog
from icefall.commit.delta_storage import S3Settings
from icefall.devstack.azurite import Azurite
from icefall.devstack.gcs import GcsEmulator
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.procs import free_port
from icefall.testing.delta import aws_env, delta_ids, delta_manifest
from icefall.testing.streams import NAMESPACE, assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "icefall.cli"]


def wait_for(
    what: str, check: Callable[[], bool], timeout: float, proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"icefall run exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
        try:
            if check():
                return
        except Exception:  # the table may not exist yet, or a server is down on purpose
            pass
        time.sleep(0.5)
    raise AssertionError(f"not {what} after {timeout:.0f}s; log:\n{log.read_text()[-4000:]}")


def committed(config: CatalogConfig, name: str) -> dict[int, int]:
    return read_committed(config.pyiceberg().load_table((NAMESPACE, name))).offsets


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start_run(
    manifest: Path, state: Path, metrics_port: int, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    import os

    with open(log, "wb") as out:
        return subprocess.Popen(
            [*CLI, "run", "-f", str(manifest), "--state-dir", str(state), "--metrics-port", str(metrics_port),
             "--no-maintenance"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip


def stop_run(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"icefall run did not stop on SIGTERM:\n{log.read_text()[-4000:]}") from None


def wait_out_outage(
    server: Any,
    service: str,
    where: str,
    during: Callable[[], None],
    *,
    run: tuple[subprocess.Popen[bytes], Path, int],
    table: str,
    caught_up: Callable[[], bool],
    show_within: float = 120,
) -> list[str]:
    """`server` stopped for ~15 s while `during()` runs (records produced, other commands checked), the
    outage shown by `icefall_ingest_unavailable{service}` of `run` (its process, log and metrics port),
    then started again: once caught up the gauge is 0 again. The log's retry lines naming `where` (at
    least one)."""
    proc, log, port = run
    label = {"table": table, "service": service}
    server.stop()
    down = time.monotonic()
    during()
    wait_for(
        f"showing the {service} outage",
        lambda: metric(scrape(port), "icefall_ingest_unavailable", **label) == 1,
        show_within, proc, log,
    )  # fmt: skip
    while time.monotonic() - down < 15:
        assert proc.poll() is None, log.read_text()[-4000:]
        time.sleep(1)
    server.start()
    wait_for(f"caught up after the {service} outage", caught_up, 300, proc, log)
    assert metric(scrape(port), "icefall_ingest_unavailable", **label) == 0
    lines = [line for line in log.read_text().splitlines() if "retrying in" in line and where in line]
    assert lines, log.read_text()[-4000:]
    return lines


def one_line_failure(
    command: list[str], manifest: Path, state: Path, env: Mapping[str, str] | None = None
) -> str:
    """Run `icefall <command>`; it must fail with exit 1 and no traceback. Its last line."""
    import os

    done = subprocess.run(
        [*CLI, *command, "-f", str(manifest), "--state-dir", str(state)],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr[-3000:])
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.long  # `make test-all`; `make test` has the object store and catalog outages
def test_icefall_run_waits_out_a_broker_restart_and_status_and_verify_say_so(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka").start()
    proc = None
    try:
        topic, name = "outage-kafka", "outage_kafka"
        broker.create_topic(topic, partitions=2)
        produce(broker, topic, 0, 300)
        manifest = tmp_path / "table.yaml"
        manifest.write_text(manifest_text(name, topic, broker.bootstrap))
        state, log, port = tmp_path / "state", tmp_path / "run.log", free_port()
        config = CatalogConfig.embedded(state)
        proc = start_run(manifest, state, port, log)
        high = watermarks(broker, topic)
        wait_for("caught up", lambda: committed(config, name) == high, 400, proc, log)
        label = {"table": f"{NAMESPACE}.{name}", "service": "kafka"}

        broker.stop()
        down = time.monotonic()
        for command in (["status"], ["verify"]):
            last = one_line_failure(command, manifest, state)
            assert last.startswith(f"icefall: cannot reach Kafka at {broker.bootstrap}"), last
        wait_for(
            "showing the outage",
            lambda: metric(scrape(port), "icefall_ingest_unavailable", **label) == 1,
            120, proc, log,
        )  # fmt: skip
        while time.monotonic() - down < 20:
            assert proc.poll() is None, log.read_text()[-4000:]
            time.sleep(1)
        samples = scrape(port)
        assert metric(samples, "icefall_ingest_outages_total", **label) == 1
        assert metric(samples, "icefall_ingest_unavailable_retries_total", **label) >= 2

        broker.start()
        produce(broker, topic, 300, 200)
        high = watermarks(broker, topic)
        wait_for("caught up after the outage", lambda: committed(config, name) == high, 300, proc, log)
        assert metric(scrape(port), "icefall_ingest_unavailable", **label) == 0
        stop_run(proc, log)
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
        failures = [line for line in text.splitlines() if f"cannot reach Kafka at {broker.bootstrap}" in line]
        assert len(failures) >= 2, text[-4000:]
        assert all("retrying in" in line for line in failures), failures
        assert "answers again" in text, text[-4000:]
        print("\n".join(failures))
        assert_exactly_once(config, name, high, set(), bootstrap=broker.bootstrap)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        broker.stop()


def test_icefall_run_waits_out_object_store_and_catalog_outages(tmp_path: Path, kafka: KafkaBroker) -> None:
    store = ObjectStore(tmp_path / "objectstore").start()
    postgres = PostgresServer(tmp_path / "postgres").start()
    proc = None
    try:
        store.create_bucket("outage-lake")
        s3 = store.properties()
        env = {
            "IT_S3_ACCESS_KEY": s3["s3.access-key-id"],
            "IT_S3_SECRET_KEY": s3["s3.secret-access-key"],
            "IT_PG_PASSWORD": postgres.password,
        }
        uri = f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{postgres.database}"
        block: dict[str, Any] = {
            "name": "outage",
            "type": "sql",
            "uri": uri,
            "warehouse": "s3://outage-lake/jdbc",
            "properties": {
                "s3.endpoint": store.endpoint,
                "s3.region": store.region,
                "s3.path-style-access": "true",
            },
            "secretProperties": {
                "s3.access-key-id": {"env": "IT_S3_ACCESS_KEY"},
                "s3.secret-access-key": {"env": "IT_S3_SECRET_KEY"},
                "password": {"env": "IT_PG_PASSWORD"},
            },
        }
        topic, name = "outage-lake", "outage_lake"
        kafka.create_topic(topic, partitions=2)
        produce(kafka, topic, 0, 200)
        manifest = tmp_path / "table.yaml"
        manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block))
        config = CatalogConfig.for_table(load_manifest(manifest).spec, environ=env)
        state, log, port = tmp_path / "state", tmp_path / "run.log", free_port()
        proc = start_run(manifest, state, port, log, env)
        produced = 200

        def caught_up() -> bool:
            return committed(config, name) == watermarks(kafka, topic)

        wait_for("caught up", caught_up, 400, proc, log)
        for service, server, where in (
            ("object_store", store, store.endpoint),
            ("catalog", postgres, uri),
        ):

            def during(service: str = service, start: int = produced) -> None:
                produce(kafka, topic, start, 100)  # Kafka is up: records keep coming during the outage
                if service == "catalog":
                    last = one_line_failure(["status"], manifest, state, env)
                    assert last.startswith(f"icefall: cannot reach the catalog at {uri}"), last

            lines = wait_out_outage(
                server, service, where, during,
                run=(proc, log, port), table=f"{NAMESPACE}.{name}", caught_up=caught_up,
            )  # fmt: skip
            produced += 100
            label = {"table": f"{NAMESPACE}.{name}", "service": service}
            assert metric(scrape(port), "icefall_ingest_outages_total", **label) == 1
            print(f"{service}:", *lines[:3], sep="\n")
        stop_run(proc, log)
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
        assert_exactly_once(config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        postgres.stop()
        store.stop()


def test_a_delta_table_on_s3_waits_out_an_object_store_outage(
    tmp_path: Path, kafka: KafkaBroker, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Delta writer (`spec.table.format: delta` on S3, its own conditional-PUT log writer and pyarrow's
    S3 client) meets the object store's outage as the Iceberg writer does: shown, waited out, and every
    record once by content after it (delta-rs and `icefall verify`)."""
    store = ObjectStore(tmp_path / "objectstore").start()
    proc = None
    try:
        store.filesystem().create_dir("delta-outage")
        env = aws_env(store)
        for key, value in env.items():  # this process's reads of the log and delta-rs's
            monkeypatch.setenv(key, value)
        topic, location = "delta-outage", "s3://delta-outage/orders"
        kafka.create_topic(topic, partitions=2)
        produce(kafka, topic, 0, 200)
        manifest = tmp_path / "table.yaml"
        manifest.write_text(delta_manifest("delta-outage", kafka.bootstrap, topic, location, max_records=100))
        st = load_manifest(manifest)
        state, log, port = tmp_path / "state", tmp_path / "run.log", free_port()
        proc = start_run(manifest, state, port, log, env)

        def caught_up() -> bool:
            return DeltaLog(location).snapshot().committed.offsets == watermarks(kafka, topic)

        wait_for("caught up", caught_up, 400, proc, log)
        lines = wait_out_outage(
            store, "object_store", f"the object store at {location}", lambda: produce(kafka, topic, 200, 100),
            run=(proc, log, port), table=".".join(st.table_identifier), caught_up=caught_up,
        )  # fmt: skip
        print("object_store:", *lines[:3], sep="\n")
        stop_run(proc, log)
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
        assert delta_ids(location, S3Settings.from_env(env).delta_rs_options()) == Counter(range(300))
        audit = verify_delta_table(st, state, spark=spark)
        assert audit.ok and audit.content_checked, audit.render()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        store.stop()


def cloud_store(kind: str, workdir: Path) -> tuple[Any, str, dict[str, Any], dict[str, str]]:
    """A started emulator for `kind` (gcs, azure), its endpoint as outage lines name it, the catalog
    block's storage fields and the variables its secret references read."""
    if kind == "gcs":
        gcs = GcsEmulator(workdir).start()
        gcs.create_bucket("outage-lake")
        return gcs, gcs.endpoint, {"warehouse": "gs://outage-lake/lake", "properties": gcs.properties()}, {}
    azurite = Azurite(workdir).start()
    azurite.create_container("outage-lake")
    properties = azurite.properties()
    env = {"IT_ADLS_KEY": properties.pop("adls.account-key")}
    block = {
        "warehouse": azurite.location("outage-lake", "lake"),
        "properties": properties,
        "secretProperties": {"adls.account-key": {"env": "IT_ADLS_KEY"}},
    }
    return azurite, azurite.authority, block, env


@pytest.mark.long
@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_icefall_run_waits_out_a_cloud_storage_outage(tmp_path: Path, kafka: KafkaBroker, kind: str) -> None:
    """A table in Google Cloud Storage (fake-gcs-server) or Azure storage (Azurite), on a SQLite catalog:
    the store stopped ~15 s while records keep coming. The same process logs one line per attempt naming
    the store's endpoint, resumes by itself, and every record lands exactly once."""
    store, endpoint, storage, env = cloud_store(kind, tmp_path / kind)
    proc = None
    try:
        block: dict[str, Any] = {
            "name": f"outage_{kind}",
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
            **storage,
        }
        topic, name = f"outage-{kind}", f"outage_{kind}"
        kafka.create_topic(topic, partitions=2)
        produce(kafka, topic, 0, 200)
        manifest = tmp_path / "table.yaml"
        manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block))
        config = CatalogConfig.for_table(load_manifest(manifest).spec, environ=env)
        state, log, port = tmp_path / "state", tmp_path / "run.log", free_port()
        proc = start_run(manifest, state, port, log, env)

        def caught_up() -> bool:
            return committed(config, name) == watermarks(kafka, topic)

        wait_for("caught up", caught_up, 400, proc, log)
        lines = wait_out_outage(
            store, "object_store", endpoint, lambda: produce(kafka, topic, 200, 100),
            run=(proc, log, port), table=f"{NAMESPACE}.{name}", caught_up=caught_up, show_within=240,
        )  # fmt: skip
        print(*lines[:3], sep="\n")
        stop_run(proc, log)
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
        assert_exactly_once(config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        store.stop()
