"""The Iceberg project's own REST catalog server, run from the Maven-resolved jars, on a free port.

`org.apache.iceberg.rest.RESTCatalogServer` (iceberg-open-api's test fixtures) is the server Iceberg's and
pyiceberg's integration tests run. It serves the REST protocol in front of a JDBC catalog: a SQLite file in
the work folder by default, or any JDBC URL (PostgreSQL) with a user and password. It checks a commit's
requirements against the current metadata and swaps the metadata pointer in the database atomically, so
concurrent writers are refused (409) exactly as by a production REST catalog.

The server reads its catalog properties from `CATALOG_*` environment variables (`CATALOG_IO__IMPL` is
`io-impl`, `CATALOG_S3_ACCESS__KEY__ID` is `s3.access-key-id`): any property without `_` or capitals can be
passed, e.g. S3FileIO's `s3.endpoint`, `s3.path-style-access`, `client.region`.

Not guaranteed: the server binds its port on all interfaces (it has no bind-address setting); clients here
use 127.0.0.1 only. `stop()` keeps the catalog database and warehouse; `start()` again serves them on the
same port.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from icefall.devstack.procs import ManagedProcess, free_port, java
from icefall.devstack.tools import tool_dir

if TYPE_CHECKING:
    from icefall.devstack.objectstore import ObjectStore
    from icefall.devstack.postgres import PostgresServer

_MAIN = "org.apache.iceberg.rest.RESTCatalogServer"
_ENV_PREFIX = "CATALOG_"


def catalog_env(properties: Mapping[str, str]) -> dict[str, str]:
    """The server's environment variables for catalog `properties` (`__` is `-`, `_` is `.`, upper case)."""
    env = {}
    for key, value in properties.items():
        if "_" in key or key != key.lower():
            raise ValueError(
                f"catalog property {key!r} cannot be passed to the REST server (no '_', lower case)"
            )
        env[_ENV_PREFIX + key.replace("-", "__").replace(".", "_").upper()] = value
    return env


def s3_file_io(store: Mapping[str, str]) -> dict[str, str]:
    """The server's FileIO settings for tables in an object store, from `ObjectStore.properties()`."""
    return {
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": store["s3.endpoint"],
        "s3.path-style-access": "true",
        "s3.access-key-id": store["s3.access-key-id"],
        "s3.secret-access-key": store["s3.secret-access-key"],
        "client.region": store["s3.region"],
    }


class RESTCatalogServer:
    """Start with `start()`, stop with `stop()`; `uri` is `http://127.0.0.1:<port>` for a REST catalog client.

    `jdbc_uri` backs the catalog (default: `jdbc:sqlite:<workdir>/catalog.db`), `warehouse` is where new
    tables go (default: `file://<workdir>/warehouse`), `properties` are further catalog properties (e.g.
    `io-impl`, `s3.endpoint`). `catalog_name` is the name the JDBC catalog stores its rows under: the same as
    a pyiceberg SqlCatalog's name to share its tables.
    """

    def __init__(  # noqa: PLR0913 (keyword-only settings)
        self,
        workdir: Path,
        *,
        jdbc_uri: str | None = None,
        jdbc_user: str | None = None,
        jdbc_password: str | None = None,
        warehouse: str | None = None,
        catalog_name: str = "icefall",
        properties: Mapping[str, str] | None = None,
        heap: str = "384m",
        log_level: str = "warn",
    ) -> None:
        self.workdir = workdir
        self.jdbc_uri = jdbc_uri or f"jdbc:sqlite:{workdir / 'catalog.db'}"
        self.warehouse = warehouse or (workdir / "warehouse").as_uri()
        self.catalog_name = catalog_name
        self.heap = heap
        self.log_level = log_level
        self.properties = {"uri": self.jdbc_uri, "warehouse": self.warehouse, **dict(properties or {})}
        if jdbc_user is not None:
            self.properties["jdbc.user"] = jdbc_user
        if jdbc_password is not None:
            self.properties["jdbc.password"] = jdbc_password
        catalog_env(self.properties)  # refuse a property the server cannot be given, before starting it
        self.port = 0
        self._proc: ManagedProcess | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "rest-catalog.log"

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    @classmethod
    def on_postgres(
        cls, workdir: Path, postgres: PostgresServer, database: str, *, warehouse: str, store: ObjectStore
    ) -> RESTCatalogServer:
        """The shape of a production lake: the server on a PostgreSQL database of its own (created here),
        new tables under `warehouse`, their files in `store` (not started yet)."""
        postgres.create_database(database)
        return cls(
            workdir,
            jdbc_uri=postgres.jdbc_url_for(database),
            jdbc_user=postgres.user,
            jdbc_password=postgres.password,
            warehouse=warehouse,
            properties=s3_file_io(store.properties()),
        )

    def start(self, timeout: float = 90) -> RESTCatalogServer:
        """First call: a fresh work folder and port. Later calls: the same catalog on the same port."""
        if self.running():
            return self  # a second server would share the port: Jetty binds it with SO_REUSEPORT
        if not self.port:
            if self.workdir.exists():
                shutil.rmtree(self.workdir)
            self.workdir.mkdir(parents=True)
            self.port = free_port()
        # Only our CATALOG_* variables: one left in the caller's environment would change the catalog.
        env = {key: value for key, value in os.environ.items() if not key.startswith(_ENV_PREFIX)}
        env.update(catalog_env({**self.properties, "catalog.name": self.catalog_name}))
        env.update(catalog_env({"rest.port": str(self.port)}))
        jars = tool_dir("ICEFALL_REST_CATALOG_JARS")
        argv = [
            *java(
                f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dorg.slf4j.simpleLogger.defaultLogLevel={self.log_level}",
            ),
            "-cp", f"{jars}/*", _MAIN,
        ]  # fmt: skip
        self._proc = ManagedProcess("rest-catalog", argv, self.log_path, env=env).start()
        self._proc.wait_ready(self._ready, timeout, "serving /v1/config")
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=5) as response:
            return response.status == 200 and "endpoints" in json.load(response)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the server (a crash); the next `start()` serves the same catalog on the same port."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None
