"""Azure storage on loopback: Azurite's Blob service (Microsoft's emulator, from npm), for `abfss://` tables.

Guarantees: the server listens only on a free 127.0.0.1 port (the same one again when restarted), keeps its
blobs in its own folder (kept across a restart) and serves the emulator's well-known development account
(`devstoreaccount1` and its published key: a test value, not a secret). `start()` returns once the service
answers a signed request (list containers). pyarrow's `AzureFileSystem` and Iceberg's `ADLSFileIO` both
create, read, list and delete files here (the integration tests prove it). Runs with `--loose` (unknown
headers are ignored), `--skipApiVersionCheck` (the clients' SDKs are newer than the emulator) and
`--disableProductStyleUrl` (the account is the first path segment, as both clients address a loopback
endpoint).

Not guaranteed: ADLS Gen2's hierarchical namespace (atomic directory renames, ACLs); Iceberg does not use
them. No TLS: locations say `abfss://`, the endpoint is `http://` (set by the properties below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icefall.devstack.procs import LoopbackServer, ManagedProcess
from icefall.devstack.tools import tool_dir

if TYPE_CHECKING:
    from pyarrow.fs import AzureFileSystem

ACCOUNT = "devstoreaccount1"
# Azurite's published development key (the same in every installation; documented by Microsoft).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azurite(LoopbackServer):
    """Start with `start()`, stop with `stop()`; `authority` is `127.0.0.1:<port>`."""

    what = "azurite"
    log_name = "azurite.log"
    account = ACCOUNT
    account_key = ACCOUNT_KEY

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Azurite:
        """First call: a fresh data folder and port. Later calls: the same ones again (a restart, as after
        an outage: the blobs are still there)."""
        self._claim()
        argv = [
            str(tool_dir("ICEFALL_AZURITE_BIN") / "azurite-blob"),
            "--blobHost=127.0.0.1",
            f"--blobPort={self.port}",
            f"--location={self.data_dir}",
            "--silent",
            "--loose",
            "--skipApiVersionCheck",
            "--disableProductStyleUrl",
        ]
        self._proc = ManagedProcess("azurite", argv, self.log_path).start()
        self._proc.wait_ready(self.healthy, timeout, "answering requests")
        return self

    def healthy(self) -> bool:
        from pyarrow.fs import FileSelector

        self.filesystem().get_file_info(FileSelector("", recursive=False))
        return True

    def filesystem(self) -> AzureFileSystem:
        """A pyarrow client for the development account; paths are `container/key`."""
        from pyarrow.fs import AzureFileSystem

        return AzureFileSystem(
            account_name=self.account,
            account_key=self.account_key,
            blob_storage_authority=self.authority,
            dfs_storage_authority=self.authority,
            blob_storage_scheme="http",
            dfs_storage_scheme="http",
        )

    def create_container(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def location(self, container: str, path: str = "") -> str:
        """`abfss://<container>@devstoreaccount1.dfs.core.windows.net/<path>`: the form ADLSFileIO reads."""
        return f"abfss://{container}@{self.account}.dfs.core.windows.net/{path}".rstrip("/")

    def properties(self) -> dict[str, str]:
        """FileIO properties for tables here, in pyiceberg's names (CatalogConfig derives Java's)."""
        return {
            "adls.account-name": self.account,
            "adls.account-key": self.account_key,
            "adls.blob-storage-authority": self.authority,
            "adls.dfs-storage-authority": self.authority,
            "adls.blob-storage-scheme": "http",
            "adls.dfs-storage-scheme": "http",
        }
