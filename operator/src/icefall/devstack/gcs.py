"""A Google Cloud Storage emulator on loopback: fake-gcs-server, built from the Go module proxy.

Used by the tests for tables whose warehouse is `gs://`. Guarantees: the server listens only on a free
127.0.0.1 port over plain HTTP (the JSON and upload APIs, `-scheme http`), keeps its objects in its own
folder (`-backend filesystem`, so a `stop()` then `start()` keeps them) and hands out upload URLs on the same
address (`-external-url`), which resumable uploads (Iceberg Java's GCSFileIO writes with them) follow.
`start()` returns once the bucket list answers.

The emulator takes any credentials or none: clients set `gcs.no-auth=true` (Iceberg Java), and Icefall's
catalog config gives pyiceberg a placeholder token in its place (see icefall.catalog.config).

Not guaranteed: the port is free when first picked. No TLS, no IAM, no object versioning; a bucket's
location is a name only. This is an emulator of the API, not Google's storage: real GKE tables use the same
properties minus `gcs.service.host` and `gcs.no-auth`, with Workload Identity as the credentials.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from icefall.devstack.procs import LoopbackServer, ManagedProcess
from icefall.devstack.tools import tool_dir

if TYPE_CHECKING:
    from pyarrow.fs import GcsFileSystem


class GcsEmulator(LoopbackServer):
    """Start with `start()`, stop with `stop()`; `endpoint` is `http://127.0.0.1:<port>`."""

    what = "the GCS emulator"
    log_name = "fake-gcs-server.log"
    project_id = "icefall-test"

    def start(self, timeout: float = 60) -> GcsEmulator:
        """First call: a fresh data folder and port. Later calls: the same ones again (a restart)."""
        self._claim()
        binary = str(tool_dir("ICEFALL_FAKE_GCS_BIN") / "fake-gcs-server")
        argv = [
            binary,
            "-scheme=http",
            "-host=127.0.0.1",
            f"-port={self.port}",
            "-backend=filesystem",
            f"-filesystem-root={self.data_dir}",
            f"-public-host=127.0.0.1:{self.port}",
            f"-external-url={self.endpoint}",
            "-log-level=warn",
        ]
        self._proc = ManagedProcess("fake-gcs-server", argv, self.log_path).start()
        self._proc.wait_ready(self.healthy, timeout, "listing buckets")
        return self

    def healthy(self, timeout: float = 3) -> bool:
        """True when the JSON API answers a bucket list; raises if it does not answer in `timeout`."""
        with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=timeout) as response:
            return bool(response.status == 200)

    def create_bucket(self, name: str) -> None:
        """Create bucket `name` (no error if it exists)."""
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={self.project_id}",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as error:
            if error.code != 409:  # 409: already there
                detail = error.read().decode(errors="replace").strip()
                message = f"GCS emulator: cannot create bucket {name!r}: {error.code} {detail}"
                raise RuntimeError(message) from None

    def filesystem(self) -> GcsFileSystem:
        """A pyarrow GCS client for this server; paths are `bucket/key`."""
        from pyarrow.fs import GcsFileSystem

        return GcsFileSystem(anonymous=True, scheme="http", endpoint_override=f"127.0.0.1:{self.port}")

    def properties(self) -> dict[str, str]:
        """FileIO properties for tables on this server: pyiceberg's and Iceberg Java's GCS names."""
        return {
            "gcs.service.host": self.endpoint,
            "gcs.project-id": self.project_id,
            "gcs.no-auth": "true",
        }
