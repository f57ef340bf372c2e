"""The test object store is a real S3 server: a pyiceberg SqlCatalog with an `s3://` warehouse writes a
table's data and metadata into it as objects that a separate S3 client lists; they are still readable after
the server is stopped and started again on the same port and data, a paused server answers nothing, and
its log never holds the secret key.

Not proven here: Spark writing to it (Iceberg Java's S3FileIO needs its own jars), or behaviour under load.
"""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow.fs import FileSelector, FileType
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from icefall.devstack.objectstore import ObjectStore

pytestmark = pytest.mark.integration

ROWS = pa.table(
    {
        "id": pa.array([1, 2, 3], pa.int64()),
        "name": pa.array(["ada", "grace", "edsger"], pa.string()),
    }
)


def _catalog(store: ObjectStore, bucket: str, tmp_path: Path) -> SqlCatalog:
    return SqlCatalog(
        "lake",
        uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=f"s3://{bucket}/wh",
        **store.properties(),
    )


def _write_table(store: ObjectStore, bucket: str, tmp_path: Path) -> Table:
    store.create_bucket(bucket)
    catalog = _catalog(store, bucket, tmp_path)
    catalog.create_namespace("smoke")
    table = catalog.create_table("smoke.people", schema=ROWS.schema)
    table.append(ROWS)
    return table


def _read_back(store: ObjectStore, bucket: str, tmp_path: Path) -> pa.Table:
    table = _catalog(store, bucket, tmp_path).load_table("smoke.people")
    return table.scan().to_arrow().sort_by("id")


def test_iceberg_table_lives_in_the_object_store(object_store: ObjectStore, tmp_path: Path) -> None:
    table = _write_table(object_store, "smoke-lake", tmp_path)

    assert _read_back(object_store, "smoke-lake", tmp_path).equals(ROWS)
    assert table.metadata_location.startswith("s3://smoke-lake/wh/")
    data_files = table.inspect.files().column("file_path").to_pylist()
    assert data_files
    # A second client, not pyiceberg's, sees every data file as an object of the bucket.
    fs = object_store.filesystem()
    listed = {
        info.path: info.size
        for info in fs.get_file_info(FileSelector("smoke-lake/wh", recursive=True))
        if info.type == FileType.File
    }
    for path in data_files:
        assert path.startswith("s3://smoke-lake/wh/")
        assert listed[path.removeprefix("s3://")] > 0
    assert table.metadata_location.removeprefix("s3://") in listed


def test_data_survives_a_restart_and_a_paused_server_answers_nothing(tmp_path: Path) -> None:
    # Its own server: stopping the session's one would disturb the tests that share it.
    store = ObjectStore(tmp_path / "objectstore").start()
    try:
        _write_table(store, "outage", tmp_path)
        endpoint = store.endpoint

        store.stop()
        with pytest.raises(urllib.error.URLError):  # connection refused
            store.healthy()
        store.start()
        assert store.endpoint == endpoint
        assert _read_back(store, "outage", tmp_path).equals(ROWS)

        store.pause()
        with pytest.raises(TimeoutError):
            store.healthy(timeout=1)
        store.resume()
        assert store.healthy()
        assert _read_back(store, "outage", tmp_path).equals(ROWS)
    finally:
        store.stop()
    log = store.log_path.read_text(errors="replace")
    assert f"API: {endpoint}" in log
    assert store.secret_key not in log
