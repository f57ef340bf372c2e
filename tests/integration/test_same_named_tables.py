"""Two tables with the same name in different Iceberg namespaces, ingested at the same time by two
`icefall run`s in one folder, never wait for each other: real Kafka, Spark and catalog.

Both tables are called `orders_xxx...` (63 characters), one in Iceberg namespace `sales`, one in `staging`,
each fed by its own topic, and both processes keep their Leases in the same `--state-dir`. The first
process runs on; the second starts only once the first holds its commit Lease (its table has a commit),
with `--lease-timeout 20`. Proves:
- the second catches up and exits 0 while the first still runs: the two commit Leases are different
  (before identity-keyed names, both were `icefall-orders-...-commit` in one folder, and the second gave up
  after 20 s with exit 3);
- the Lease files in the folder are one commit Lease per table, each named with its table's identity hash;
- the first stops cleanly on SIGTERM, and each table holds its own topic's records exactly once, checked
  record by record.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from icefall.api import streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.names import table_leases
from icefall.testing.streams import assert_exactly_once, manifest_text, produce, watermarks

from .test_compaction_continuous import assert_stopped_cleanly, icefall, stop

pytestmark = pytest.mark.integration

TABLE = "orders_" + "x" * 56  # 63 characters: the longest name still shows in full in `kubectl get st`
RECORDS = 60
BAD_EVERY = 20


def manifest(namespace: str, topic: str, kafka: KafkaBroker, catalog: CatalogConfig, path: Path) -> Path:
    document = yaml.safe_load(manifest_text(TABLE, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0}))
    document["metadata"]["name"] = f"orders-{namespace}"
    document["spec"]["table"]["namespace"] = namespace
    document["spec"]["table"]["catalog"] = {  # the session's catalog, so the checks below read the same
        "name": catalog.name,
        "type": "sql",
        "uri": catalog.uri,
        "warehouse": catalog.warehouse,
    }
    path.write_text(yaml.safe_dump(document))
    return path


def wait_for_commit(
    catalog: CatalogConfig, process: subprocess.Popen[bytes], log: Path, *, high: dict[int, int] | None
) -> None:
    """Until the sales table has a commit (`high` None) or has caught up with `high`."""
    deadline = time.monotonic() + 240
    while True:
        offsets = None
        if catalog.pyiceberg().table_exists(("sales", TABLE)):
            offsets = read_committed(catalog.pyiceberg().load_table(("sales", TABLE))).offsets
        if offsets and (high is None or offsets == high):
            return
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"the first run did not commit {high}:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def test_same_named_tables_in_one_folder_never_wait_for_each_other(
    kafka: KafkaBroker, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    assert len(TABLE) == 63
    sales = manifest("sales", "it-same-name-sales", kafka, catalog_config, tmp_path / "sales.yaml")
    staging = manifest("staging", "it-same-name-staging", kafka, catalog_config, tmp_path / "staging.yaml")
    bad = {}
    for topic in ("it-same-name-sales", "it-same-name-staging"):
        kafka.create_topic(topic, partitions=2)
        bad[topic] = produce(kafka, topic, 0, RECORDS, BAD_EVERY)
    common = ("--state-dir", str(tmp_path / "state"), "--master", "local[1]", "--no-maintenance")
    first_log, second_log = tmp_path / "sales.log", tmp_path / "staging.log"
    first = icefall("run", "-f", str(sales), *common, log=first_log)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_for_commit(catalog_config, first, first_log, high=None)  # the first holds its commit Lease
        second = icefall(
            "run", "-f", str(staging), *common, "--until-caught-up", "--lease-timeout", "20", log=second_log
        )
        code = second.wait(300)
        assert code == 0, f"the second run exited {code}:\n{second_log.read_text()[-3000:]}"
        assert first.poll() is None, "the first run stopped early:\n" + first_log.read_text()[-3000:]
        wait_for_commit(catalog_config, first, first_log, high=watermarks(kafka, "it-same-name-sales"))
    finally:
        codes = {first_log: stop(first)}
        if second is not None and second.poll() is None:
            codes[second_log] = stop(second)
    for log, code in codes.items():
        assert_stopped_cleanly(code, log)

    folder = tmp_path / "state" / "leases"
    leases = {p.name.removesuffix(".lease.json") for p in folder.glob("*.lease.json")}
    tables = [streaming_table_from_object(yaml.safe_load(m.read_text())) for m in (sales, staging)]
    commits = {table_leases(st).commit for st in tables}
    assert len(commits) == 2 and commits <= leases, (commits, leases)
    for st, topic in zip(tables, ("it-same-name-sales", "it-same-name-staging"), strict=True):
        namespace, high = st.spec.table.namespace, watermarks(kafka, topic)
        # The spec itself: the audit's content check (with the session's Spark) decodes each record by it.
        assert_exactly_once(
            catalog_config, TABLE, high, bad[topic], namespace=namespace, bootstrap=kafka.bootstrap, st=st
        )
