"""A Delta table's folder in an object store: what S3, GCS and Azure share (`ObjectStorage`), each store's
module adding only its create-only write (`icefall.commit.delta_storage.S3Storage`,
`icefall.commit.delta_cloud`'s `GcsStorage` and `AzureStorage`).

Listing, reads, uploads and deletes go through the store's pyarrow file system (`_filesystem`); the
create-only write, which pyarrow has no call for, is one HTTP request of the subclass's (`_create`, sent by
`http_request` with a timeout). Guarantees: `put_if_absent` is True for exactly one of any number of
concurrent callers with one key, False when the object exists; any other answer raises OSError naming the
location (the caller plans again from the table). `delete_all` never deletes a whole bucket.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from icefall.commit.errors import ObjectStoreUnreachableError

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

_IN_FLIGHT_RETRIES = 20


class ObjectStorage:
    """A table folder under an object store's prefix (`<scheme>://bucket/path`): listing, reads, uploads and
    deletes by the store's pyarrow client (`_filesystem`), the create-only write by a request of the
    subclass's own (`_create`; pyarrow has none)."""

    location: str

    def __init__(self, location: str, bucket: str, prefix: str) -> None:
        self.location = location
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._fs: FileSystem | None = None

    def _key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def _path(self, relative: str) -> str:
        """`relative`'s path in the pyarrow file system: `bucket/key`."""
        return f"{self.bucket}/{self._key(relative)}"

    def _filesystem(self) -> FileSystem:
        raise NotImplementedError

    def _create(self, key: str, data: bytes) -> Created:
        """Create object `key` only if it does not exist; any answer but the three raises OSError."""
        raise NotImplementedError

    @property
    def fs(self) -> FileSystem:
        if self._fs is None:
            self._fs = self._filesystem()
        return self._fs

    def list(self, relative: str) -> list[str]:
        from pyarrow.fs import FileSelector

        return [info.base_name for info in self.fs.get_file_info(FileSelector(self._path(relative), True))]

    def list_times(self, relative: str) -> dict[str, int]:
        """`list` with each object's modification time (ms)."""
        from pyarrow.fs import FileSelector, FileType

        selector = FileSelector(self._path(relative), allow_not_found=True)
        return {
            info.base_name: (info.mtime_ns or 0) // 1_000_000
            for info in self.fs.get_file_info(selector)
            if info.type == FileType.File
        }

    def list_after(self, relative: str, after: str) -> dict[str, int]:
        """`list_times` of the names sorting after `after`: the whole listing filtered (S3 asks for the
        tail only, `S3Storage.list_after`)."""
        return {name: ms for name, ms in self.list_times(relative).items() if name > after}

    def list_tree(self) -> dict[str, int]:
        """Every object under the table's prefix (relative key → modification time, ms): what VACUUM sees."""
        from pyarrow.fs import FileSelector, FileType

        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        selector = FileSelector(base, allow_not_found=True, recursive=True)
        return {
            info.path[len(base) + 1 :]: (info.mtime_ns or 0) // 1_000_000
            for info in self.fs.get_file_info(selector)
            if info.type == FileType.File
        }

    def delete(self, relative: str) -> bool:
        """Delete an object under the table's prefix; False if it was gone."""
        try:
            self.fs.delete_file(self._path(relative))
        except FileNotFoundError:
            return False
        return True

    def read(self, relative: str) -> bytes:
        with self.fs.open_input_stream(self._path(relative)) as f:
            data: bytes = f.read()
            return data

    def move_in(self, staged: Path, relative: str | None = None) -> int:
        data = staged.read_bytes()
        with self.fs.open_output_stream(self._path(relative or staged.name)) as out:
            out.write(data)
        staged.unlink()
        return len(data)

    def arrow(self) -> tuple[FileSystem | None, str]:
        return self.fs, f"{self.bucket}/{self.prefix}"

    def delete_all(self) -> None:
        """Every object under the table's prefix and its '/' (a purge): never `<prefix>-eu/...`."""
        if not self.prefix:
            raise ValueError(f"{self.location}: refusing to delete a whole bucket; give the table a folder")
        from pyarrow.fs import FileType

        folder = f"{self.bucket}/{self.prefix}"
        self.fs.delete_dir_contents(folder, missing_dir_ok=True)
        if self.fs.get_file_info(folder).type is not FileType.NotFound:
            self.fs.delete_dir(folder)  # a folder marker object, where the store keeps one

    def put_if_absent(self, relative: str, data: bytes) -> bool:
        key = self._key(relative)
        for _ in range(_IN_FLIGHT_RETRIES):
            created = self._create(key, data)
            if created is Created.IN_FLIGHT:  # resolves to created or exists once the other write completes
                time.sleep(0.2)
                continue
            return created is Created.YES
        raise OSError(f"create {self.location}/{relative}: conditional writes kept conflicting")


class Created(Enum):
    """A create-only write's outcome: made it, the object exists, or another create of it is in flight."""

    YES = "yes"
    NO = "no"
    IN_FLIGHT = "in-flight"


def http_request(
    method: str, base: str, path: str, body: bytes, *, headers: Mapping[str, str], timeout: float = 30
) -> tuple[int, bytes]:
    """One HTTP(S) request to `base` (`scheme://host[:port]`) for `path` (encoded, with its query): its
    status and body. OSError when it cannot be sent or answered within `timeout` seconds."""
    url = urlparse(base)
    connection_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(url.netloc, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=dict(headers))
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as error:  # no answer: an outage (ingest.outages)
        where = f"{url.scheme}://{url.netloc}{path.split('?', 1)[0]}"
        raise ObjectStoreUnreachableError(f"{method} {where}: {type(error).__name__}: {error}") from error
    finally:
        connection.close()
