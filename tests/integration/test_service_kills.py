"""The services of the commit path SIGKILLed at chosen moments under a running `icefall run`: exactly once.

Each test starts its own server (it is killed), a table fed by the `kafka` fixture, and one `icefall run`
process (local Spark, as a user starts it); the kill lands at a moment the test makes sure of, not by
timing luck; the server is started again on the same port with its data; then the table must hold every
record exactly once, record by record and by `icefall verify` (the auditor, by content).

Proves:
- (`long`) PostgreSQL (the JDBC catalog) SIGKILLed mid-commit: the run is held by a failpoint just before
  a main commit, the test locks the table's catalog row, the commit's `UPDATE` waits on it (seen in
  `pg_stat_activity`), and the postmaster and every backend are killed then: the transaction is rolled
  back by crash recovery and the writer, which never got an answer, resumes from the table;
- the REST catalog server killed after it applied a commit but before it answered (the unknown outcome): a
  front on 127.0.0.1 passes a main commit to the real server, takes its answer (the commit is in the
  catalog), kills the server and closes the writer's connection without a word; after the restart the
  table holds that commit once, and no record twice (`make test`);
- (`long`) MinIO SIGKILLed mid-upload, multipart in flight: a TCP front passes the bytes on until a commit's
  new table metadata file is being uploaded (pyarrow uploads in parts: the upload was created, its first
  part on the wire), then kills the store; the commit fails before it swaps the table's pointer, the
  unfinished upload stays behind in the store, and the writer waits the store out and resumes.

Not proven here: a data file's multipart upload cut off (Spark's S3FileIO wrote 9 MB files in one PUT with
`s3.multipart.size` 5 MB); the kube-apiserver restarting.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.testing.live_run import LiveRun
from icefall.testing.streams import NAMESPACE, assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

BATCH = {"maxRecords": 100, "minIntervalSeconds": 0}


@contextmanager
def live_run(
    kafka: KafkaBroker, tmp_path: Path, name: str, block: dict[str, Any], env: dict[str, str]
) -> Iterator[LiveRun]:
    """300 records on a new topic and `icefall run` on them into `it.<name>` of the catalog `block`; stopped
    on the way out."""
    topic = f"it-svc-{name.replace('_', '-')}"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 300)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block, batch=BATCH))
    config = CatalogConfig.for_table(load_manifest(manifest).spec, environ=env)
    state = tmp_path / "state"
    run = LiveRun(manifest, config=config, kafka=kafka, name=name, topic=topic, state=state, env=env)
    try:
        yield run
    finally:
        run.stop()


def finish(run: LiveRun, env: dict[str, str]) -> None:
    """More records, caught up, stopped; then exactly once record by record and by `icefall verify`."""
    produce(run.kafka, run.topic, 300, 100)
    run.wait_caught_up()
    run.stop()
    assert "cannot reach the catalog" in run.text(), run.tail()  # the writer met the kill
    assert "Traceback" not in run.text(), run.tail()
    high = watermarks(run.kafka, run.topic)
    assert sum(high.values()) == 400
    assert_exactly_once(run.config, run.name, high, set())
    verify = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(run.manifest),
         "--state-dir", str(run.state)],
        capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **env},
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert "by content: OK" in verify.stdout, verify.stdout


@pytest.mark.long  # `make test-all` (about a minute); `make test` has the REST catalog's unknown outcome
def test_postgres_sigkill_mid_commit(kafka: KafkaBroker, tmp_path: Path) -> None:
    import psycopg2

    postgres = PostgresServer(tmp_path / "postgres").start()
    try:
        name = "svc_pg_kill"
        env = {"IT_PG_PASSWORD": postgres.password, "ICEFALL_FAILPOINTS": "main.before-commit=sleep:10@3"}
        block = {
            "name": "icefall",
            "type": "sql",
            "uri": f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{postgres.database}",
            "warehouse": (tmp_path / "warehouse").as_uri(),
            "secretProperties": {"password": {"env": "IT_PG_PASSWORD"}},
        }
        with live_run(kafka, tmp_path, name, block, env) as run:
            # Held just before its third main commit: the row that commit must update is locked here.
            run.wait_for(
                "at the third main commit", lambda: "main.before-commit triggered (hit 3)" in run.text(), 400
            )
            connect = {
                "host": postgres.host, "port": postgres.port, "user": postgres.user,
                "password": postgres.password, "dbname": postgres.database, "connect_timeout": 5,
            }  # fmt: skip
            holder = psycopg2.connect(**connect)
            with holder.cursor() as cur:
                cur.execute(
                    "SELECT 1 FROM iceberg_tables WHERE table_namespace = %s AND table_name = %s FOR UPDATE",
                    (NAMESPACE, name),
                )
                assert cur.fetchone() == (1,)
            watcher = psycopg2.connect(**connect)
            watcher.autocommit = True

            def commit_waits() -> bool:
                with watcher.cursor() as cur:
                    cur.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query ILIKE 'UPDATE iceberg_tables%%'"
                    )
                    return bool(cur.fetchone()[0])

            run.wait_for("the main commit waiting on the catalog row", commit_waits, 60)
            postgres.kill()  # mid-commit: the UPDATE sent, its transaction open, no answer
            for conn in (holder, watcher):
                with suppress(Exception):
                    conn.close()
            time.sleep(3)
            postgres.start()
            finish(run, env)
    finally:
        postgres.kill()


class CommitCutter:
    """A front of a REST catalog server on 127.0.0.1: requests pass as they are, except the `nth` commit
    that moves `main` of `it.<table>` (a POST to the table whose updates set the `main` ref): it is passed
    on, its answer taken (the commit is in the catalog), then `on_applied()` runs (kills the server) and
    the client's connection is closed without an answer. `applied` is that answer's body."""

    def __init__(self, upstream: str, table: str, nth: int, on_applied: Callable[[], None]) -> None:
        self.upstream = urlsplit(upstream)
        self.path = f"/v1/namespaces/{NAMESPACE}/tables/{table}"
        self.nth, self.on_applied = nth, on_applied
        self.seen = 0
        self.applied: dict[str, Any] | None = None
        self.cut = threading.Event()
        self._lock = threading.Lock()
        cutter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                cutter.forward(self)

            do_POST = do_DELETE = do_HEAD = do_PUT = do_GET  # noqa: N815 (http.server's names)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> CommitCutter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def moves_main(self, handler: BaseHTTPRequestHandler, body: bytes) -> bool:
        if handler.command != "POST" or handler.path.split("?")[0] != self.path:
            return False
        updates = json.loads(body or b"{}").get("updates", [])
        return any(u.get("action") == "set-snapshot-ref" and u.get("ref-name") == "main" for u in updates)

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        skip = {"host", "connection", "keep-alive", "content-length", "transfer-encoding", "expect"}
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in skip}
        upstream = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            upstream.request(handler.command, handler.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        except OSError:  # the server is down: the client sees its connection closed, as without a front
            handler.close_connection = True
            return
        finally:
            upstream.close()
        if answer.status == 200 and self.moves_main(handler, body) and self._count():
            gzipped = answer.getheader("Content-Encoding", "") == "gzip"
            self.applied = json.loads(gzip.decompress(data) if gzipped else data)
            self.on_applied()
            handler.close_connection = True
            with suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
            self.cut.set()
            return
        handler.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in {"transfer-encoding", "connection", "content-length", "keep-alive"}:
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def _count(self) -> bool:
        with self._lock:
            self.seen += 1
            return self.seen == self.nth


def main_ancestry(config: CatalogConfig, name: str) -> set[int]:
    table = config.pyiceberg().load_table((NAMESPACE, name))
    snapshot = table.current_snapshot()
    ids: set[int] = set()
    while snapshot is not None:
        ids.add(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return ids


def test_rest_catalog_killed_after_applying_a_commit_before_answering(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    rest = RESTCatalogServer(tmp_path / "rest").start()
    name = "svc_rest_cut"
    # The 4th commit moving main: the genesis and the epoch claim move it too, then data commits.
    cutter = CommitCutter(rest.uri, name, nth=4, on_applied=rest.kill).start()
    try:
        block = {"name": "icefall", "type": "rest", "uri": cutter.uri}
        with live_run(kafka, tmp_path, name, block, {}) as run:
            run.wait_for("a commit cut off after it applied", cutter.cut.is_set, 240)
            assert not rest.running()
            assert cutter.applied is not None
            cut_snapshot = cutter.applied["metadata"]["refs"]["main"]["snapshot-id"]
            time.sleep(3)
            rest.start()
            finish(run, {})
        assert cut_snapshot in main_ancestry(run.config, name), "the cut commit is not in the table's history"
    finally:
        cutter.stop()
        rest.kill()


class UploadCutter:
    """A TCP front of the object store on 127.0.0.1: bytes pass both ways as they are. Once `armed`, the
    first part of a multipart upload of a table metadata file (`PUT .../metadata/<file>.metadata.json?
    partNumber=...`: pyarrow uploads every file in parts, so the upload was created and its first part is
    on its way) makes `on_part()` run (it kills the store) before those bytes are passed on. That file is
    what a commit writes before it swaps the table's pointer: the kill lands mid-commit, mid-upload.
    `request` is that request line."""

    PART = re.compile(rb"PUT /[^ ]*/metadata/[^ ]*\.metadata\.json\?[^ ]*partNumber=[^ ]* HTTP/1\.1")

    def __init__(self, upstream_port: int, on_part: Callable[[], None]) -> None:
        self.upstream_port, self.on_part = upstream_port, on_part
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.request = ""
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._closing = True
        with suppress(OSError):
            self.listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:  # the store is down: so is the front
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        tail = b""
        try:
            while chunk := source.recv(65536):
                watch = from_client and self.armed.is_set() and not self.cut.is_set()
                found = self.PART.search(tail + chunk) if watch else None
                if found is not None:
                    with self._lock:
                        if not self.cut.is_set():
                            self.request = found.group().decode(errors="replace")
                            self.on_part()
                            self.cut.set()
                tail = chunk[-1024:]
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


@pytest.mark.long  # `make test-all` (about 45 s); `make test` has the REST catalog's unknown outcome
def test_minio_sigkill_mid_multipart_upload_of_a_commit(kafka: KafkaBroker, tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "objectstore").start()
    cutter = UploadCutter(store.port, on_part=store.kill)
    try:
        store.create_bucket("upload-lake")
        s3 = store.properties()
        env = {"IT_S3_ACCESS_KEY": s3["s3.access-key-id"], "IT_S3_SECRET_KEY": s3["s3.secret-access-key"]}
        name, topic = "svc_minio_cut", "it-svc-minio-cut"
        block = {
            "name": "icefall",
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
            "warehouse": "s3://upload-lake/lake",
            "properties": {
                "s3.endpoint": cutter.endpoint,
                "s3.region": store.region,
                "s3.path-style-access": "true",
            },
            "secretProperties": {
                "s3.access-key-id": {"env": "IT_S3_ACCESS_KEY"},
                "s3.secret-access-key": {"env": "IT_S3_SECRET_KEY"},
            },
        }
        kafka.create_topic(topic, partitions=2)
        produce(kafka, topic, 0, 300)
        manifest = tmp_path / "table.yaml"
        manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block, batch=BATCH))
        config = CatalogConfig.for_table(load_manifest(manifest).spec, environ=env)
        state = tmp_path / "state"
        run = LiveRun(manifest, config=config, kafka=kafka, name=name, topic=topic, state=state, env=env)
        try:
            run.wait_ingesting()
            cutter.armed.set()  # the next commit's metadata upload
            run.wait_for("a multipart upload cut off", cutter.cut.is_set, 120)
            time.sleep(3)
            store.start()
            # The upload the kill interrupted is still open in the store: it was in flight.
            assert any((store.data_dir / ".minio.sys" / "multipart").rglob("*")), "no multipart upload left"
            produce(kafka, topic, 300, 100)
            run.wait_caught_up()
            run.stop()
            assert "cannot reach the object store" in run.text(), run.tail()
            assert "Traceback" not in run.text(), run.tail()
        finally:
            run.stop()
        high = watermarks(kafka, topic)
        assert sum(high.values()) == 400
        assert_exactly_once(config, name, high, set())
        verify = subprocess.run(
            [sys.executable, "-m", "icefall.cli", "verify", "-f", str(manifest), "--state-dir", str(state)],
            capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **env},
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        assert "by content: OK" in verify.stdout, verify.stdout
    finally:
        cutter.stop()
        store.kill()
