"""A real S3-compatible object store on loopback: a single-drive MinIO server built from the Go module proxy.

Used by the tests for tables whose warehouse is `s3://`. Guarantees: the server listens only on a free
127.0.0.1 port, keeps its objects in its own data folder and has root credentials generated per instance;
`start()` returns once the object layer answers its cluster health check (it can take writes). `stop()`
followed by `start()` brings the same server back on the same port, data and credentials, so objects written
before an outage are there after it; `pause()` freezes the process (SIGSTOP) so clients see a hang instead
of a refused connection, and `resume()` lets it go on. The secret is handed over by environment and the
server runs `--anonymous`, so it is in no log or repr. Given credentials (a test that uses an example's
Secret as written) replace the generated ones.

Not guaranteed: the port is free when first picked, so a restart fails loudly if another program took it
during the outage. No TLS, versioning or erasure coding; the region is a name only (`us-east-1`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from icefall.devstack.procs import LoopbackServer, ManagedProcess
from icefall.devstack.tools import tool_dir

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem


class ObjectStore(LoopbackServer):
    """Start with `start()`, stop with `stop()`; `endpoint` is `http://127.0.0.1:<port>`."""

    what = "the object store"
    log_name = "minio.log"
    region = "us-east-1"

    def __init__(
        self, workdir: Path, *, access_key: str | None = None, secret_key: str | None = None
    ) -> None:
        """Root credentials are generated unless given (MinIO wants at least 3 and 8 characters)."""
        super().__init__(workdir)
        self.access_key = access_key or f"icefall-{secrets.token_hex(4)}"
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        self._paused = False

    def start(self, timeout: float = 60) -> ObjectStore:
        """First call: a fresh data folder and port. Later calls: the same ones again (a restart)."""
        self._claim()
        # The caller's MINIO_* variables would change the server; only ours count.
        env = {key: value for key, value in os.environ.items() if not key.startswith("MINIO_")}
        env |= {
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_SITE_REGION": self.region,
            "MINIO_BROWSER": "off",  # no web console: no second port
            "MINIO_UPDATE": "off",  # never look for a newer release
            # CI's CI=true switches MinIO's CI mode on; set it everywhere so the server behaves the same
            # locally (it also caps the buffer pool instead of sizing it from the machine's memory).
            "MINIO_CI_CD": "on",
        }
        minio = str(tool_dir("ICEFALL_MINIO_BIN") / "minio")
        argv = [minio, "server", "--anonymous", f"--address=127.0.0.1:{self.port}", str(self.data_dir)]
        self._proc = ManagedProcess("minio", argv, self.log_path, env=env).start()
        self._paused = False
        self._proc.wait_ready(self.healthy, timeout, "taking writes")
        return self

    def healthy(self, timeout: float = 3) -> bool:
        """True when the server answers and can take writes; raises if it does not answer in `timeout`."""
        # /minio/health/ready answers 200 before the object layer is up; /cluster waits for it.
        url = f"{self.endpoint}/minio/health/cluster"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)

    def stop(self) -> None:
        """Stop the server; its port, data and credentials are kept for the next `start()`."""
        if self._proc is not None:
            self.resume()  # a frozen process would only die by SIGKILL
        super().stop()

    def kill(self) -> None:
        """SIGKILL the server (a crash, uploads in flight lost); data and port kept for `start()`."""
        self._paused = False  # SIGKILL ends a frozen process too
        super().kill()

    def pause(self, timeout: float = 5) -> None:
        """Freeze the server: connections are accepted by the kernel but never answered."""
        self._signal(signal.SIGSTOP)
        self._paused = True
        # SIGSTOP is delivered asynchronously: a thread already running could still answer a request sent
        # right after kill(2) returns. Frozen means every thread shows state T.
        pid = self._proc.pid if self._proc else None
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the object store (pid {pid}) did not stop within {timeout}s")
            time.sleep(0.01)

    def resume(self) -> None:
        if self._paused:
            self._signal(signal.SIGCONT)
            self._paused = False

    def _signal(self, signum: signal.Signals) -> None:
        pid = self._proc.pid if self._proc else None
        if pid is None:
            raise RuntimeError("the object store is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signum)

    def filesystem(self) -> S3FileSystem:
        """A pyarrow S3 client for this server, allowed to create buckets; paths are `bucket/key`."""
        from pyarrow.fs import S3FileSystem

        return S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            endpoint_override=self.endpoint,
            scheme="http",
            force_virtual_addressing=False,
            allow_bucket_creation=True,
        )

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def properties(self) -> dict[str, str]:
        """FileIO properties for tables on this server: pyiceberg's and Iceberg Java's S3FileIO names."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            # Given, so pyiceberg never asks AWS which region a bucket is in.
            "s3.region": self.region,
            # Buckets are paths on 127.0.0.1, not host names: Java reads the first, pyarrow the second.
            "s3.path-style-access": "true",
            "s3.force-virtual-addressing": "false",
        }


def _all_threads_stopped(pid: int | None) -> bool:
    tasks = Path(f"/proc/{pid}/task")
    try:
        # The state is the first field after the command name, which is in parentheses.
        states = [(task / "stat").read_text().rpartition(")")[2].split()[0] for task in tasks.iterdir()]
    except FileNotFoundError:  # the process or one of its threads is gone
        return False
    return bool(states) and all(state in ("T", "t") for state in states)
