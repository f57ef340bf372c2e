"""A real schema registry on loopback: Apicurio Registry 2.6, run from its unpacked distribution.

`url` is its Confluent-compatible API (`<base>/apis/ccompat/v7`), what `spec.format.registry.url` and
confluent-kafka's `SchemaRegistryClient` are given. Started with in-memory storage and the global
compatibility rule BACKWARD, Confluent's default (Apicurio's own is NONE): a new version a reader of the
previous one could not read is refused with HTTP 409. Apicurio's `GET /config` reports NONE even so; the
rule is enforced, which only registering proves.

Guarantees: it listens on 127.0.0.1 only (Quarkus' `QUARKUS_HTTP_HOST`), on a port free when first picked;
`stop()` then `start()` is the registry going away and coming back on the same port, EMPTY (the storage is
in memory). Its output goes to `registry.log` in the work folder; if it does not answer in time, the error
carries the log's tail. Not guaranteed: schema ids equal Confluent's for the same sequence of registrations
(Apicurio's ccompat ids are its content ids: equal schemas under two subjects share one, as in Confluent).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

from icefall.devstack.procs import ManagedProcess, StartError, free_port
from icefall.devstack.tools import tool_dir

#: Where the Confluent-compatible API is, below the server's base URL.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: Settings of the caller's environment that would change the server: never passed on.
_SERVER_ENV_PREFIXES = ("REGISTRY_", "QUARKUS_", "HTTP_PORT")


def runner_jar(home: Path) -> Path:
    """The Quarkus runner jar of the unpacked distribution in `home` (its lib/ beside it)."""
    jars = sorted(home.glob("apicurio-registry-app-*-runner.jar"))
    if len(jars) != 1:
        raise StartError(f"expected one apicurio-registry-app-*-runner.jar in {home}, found {jars}")
    return jars[0]


class SchemaRegistryServer:
    """Start with `start()`, stop with `stop()`; `url` is the Confluent-compatible API's base URL.

    `compatibility` is the global compatibility rule (BACKWARD, FORWARD, FULL, NONE, ..._TRANSITIVE).
    """

    def __init__(self, workdir: Path, *, heap: str = "256m", compatibility: str = "BACKWARD") -> None:
        self.workdir = workdir
        self.heap = heap
        self.compatibility = compatibility
        self.port = 0
        self._proc: ManagedProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: `spec.format.registry.url`, `SchemaRegistryClient`'s `url`."""
        return self.base_url + CCOMPAT_PATH

    @property
    def log_path(self) -> Path:
        return self.workdir / "registry.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def start(self, timeout: float = 90) -> SchemaRegistryServer:
        """First call: a fresh work folder and port. Later calls (after `stop()`): an empty registry on the
        same port."""
        if self.running():
            raise RuntimeError("the schema registry is already running")
        if not self.port:
            if self.workdir.exists():
                shutil.rmtree(self.workdir)
            (self.workdir / "tmp").mkdir(parents=True)
            self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SERVER_ENV_PREFIXES)}
        env.update(
            {
                "HTTP_PORT": str(self.port),
                "QUARKUS_HTTP_HOST": "127.0.0.1",
                "REGISTRY_RULES_GLOBAL_COMPATIBILITY": self.compatibility,
            }
        )
        java = shutil.which("java") or "java"
        argv = [
            java, f"-Xmx{self.heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true", f"-Djava.io.tmpdir={self.workdir / 'tmp'}",
            "-jar", str(runner_jar(tool_dir("ICEFALL_REGISTRY_HOME"))),
        ]  # fmt: skip
        self._proc = ManagedProcess("schema-registry", argv, self.log_path, env=env).start()
        self._proc.wait_ready(self._ready, timeout, f"serving {CCOMPAT_PATH}/subjects")
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as response:
            return response.status == 200 and isinstance(json.load(response), list)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
