"""Where a Delta table's files live: the local file system, S3, GCS or Azure (commit/DESIGN.md, "Delta
tables on S3", "Delta tables on GCS and Azure").

The log needs four things of a store: list the `_delta_log` folder, read a file, create a file only if it
does not exist (`put_if_absent`: commit N exists once, across processes and machines), and take in the
Parquet files a batch wrote in a local folder (`move_in`). Locally creation is `link` of a synced temporary
file (never replaces). In an object store (`ObjectStorage`: listing, reads and uploads by pyarrow's client)
it is the store's create-only write: on S3 a conditional PUT (`If-None-Match: *`, 412 when the key exists,
whichever of two writers' PUTs arrives last); on GCS and Azure `icefall.commit.delta_cloud`'s. Settings come
from each cloud SDK's environment names (`S3Settings.from_env`: the AWS SDK's; GCS and Azure: that module's):
credentials by reference from a Secret, never in the spec.

Guarantees: `put_if_absent` is True for exactly one of any number of concurrent callers with one key;
False means the file exists (written by someone, possibly by an earlier attempt whose answer was lost).
Any other failure raises OSError (the caller plans again from the table).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote, unquote, urlparse

from icefall.commit.object_storage import Created, ObjectStorage, http_request
from icefall.commit.s3_list import sigv4_headers

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

S3_SCHEMES = ("s3://", "s3a://")
GCS_SCHEMES = ("gs://",)
AZURE_SCHEMES = ("abfs://", "abfss://")
#: Every object store a Delta table may live in (`icefall.plan.children.DELTA_SHARED_SCHEMES` is the same).
OBJECT_STORE_SCHEMES = S3_SCHEMES + GCS_SCHEMES + AZURE_SCHEMES
DEFAULT_REGION = "us-east-1"
#: Answers to a conditional PUT: 412 the key exists; 409 another conditional PUT of it is in flight.
_EXISTS, _IN_FLIGHT = 412, 409


def is_s3(location: str) -> bool:
    return location.startswith(S3_SCHEMES)


def store_name(location: str) -> str:
    """The store of `location` as people name it: S3, GCS, Azure or local disk (for messages)."""
    for schemes, name in ((S3_SCHEMES, "S3"), (GCS_SCHEMES, "GCS"), (AZURE_SCHEMES, "Azure")):
        if location.startswith(schemes):
            return name
    return "local disk"


def is_object_store(location: str) -> bool:
    """On S3, GCS or Azure: pods reach it, batches are staged on local disk first, commits are conditional
    writes."""
    return location.startswith(OBJECT_STORE_SCHEMES)


class DeltaStorage(Protocol):
    """The store under one table's folder; `relative` paths are '/'-separated, below the table's folder."""

    location: str

    def list(self, relative: str) -> list[str]: ...
    def list_times(self, relative: str) -> dict[str, int]: ...
    def list_after(self, relative: str, after: str) -> dict[str, int]: ...
    def list_tree(self) -> dict[str, int]: ...
    def delete(self, relative: str) -> bool: ...
    def read(self, relative: str) -> bytes: ...
    def put_if_absent(self, relative: str, data: bytes) -> bool: ...
    def move_in(self, staged: Path, relative: str | None = None) -> int: ...
    def arrow(self) -> tuple[FileSystem | None, str]: ...
    def delete_all(self) -> None: ...


class LocalStorage:
    """A table folder on the local file system (an absolute path or a file:/ URI)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.root = local_path(location)

    def list(self, relative: str) -> list[str]:
        folder = self.root / relative
        return os.listdir(folder) if folder.is_dir() else []

    def list_times(self, relative: str) -> dict[str, int]:
        """`list` with each file's modification time (ms): what Delta's time travel resolves times by."""
        folder = self.root / relative
        if not folder.is_dir():
            return {}
        return {e.name: e.stat().st_mtime_ns // 1_000_000 for e in os.scandir(folder) if e.is_file()}

    def list_after(self, relative: str, after: str) -> dict[str, int]:
        """`list_times` of the names sorting after `after` (what S3's `start-after` gives: `list_after`)."""
        return {name: ms for name, ms in self.list_times(relative).items() if name > after}

    def list_tree(self) -> dict[str, int]:
        """Every file under the table's folder (relative path → modification time, ms): what VACUUM sees."""
        found: dict[str, int] = {}
        for folder, _, names in os.walk(self.root):
            for name in names:
                path = Path(folder) / name
                found[path.relative_to(self.root).as_posix()] = path.stat().st_mtime_ns // 1_000_000
        return found

    def delete(self, relative: str) -> bool:
        """Delete a file of the table's folder; False if it was gone."""
        try:
            (self.root / relative).unlink()
        except FileNotFoundError:
            return False
        return True

    def read(self, relative: str) -> bytes:
        return (self.root / relative).read_bytes()

    def put_if_absent(self, relative: str, data: bytes) -> bool:
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
        finally:
            temporary.unlink()
        return True

    def move_in(self, staged: Path, relative: str | None = None) -> int:
        """Move the local file `staged` to `relative` (default: its name) in the table's folder."""
        target = self.root / (relative or staged.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)
        os.utime(target)  # VACUUM spares unreferenced files younger than its retention (>= 1 h): from now
        return target.stat().st_size

    def arrow(self) -> tuple[FileSystem | None, str]:
        return None, str(self.root)

    def delete_all(self) -> None:
        """The table's folder and everything in it (a purge)."""
        shutil.rmtree(self.root, ignore_errors=True)


def local_path(location: str) -> Path:
    """The folder of a table at `location` (an absolute path or a file:/ URI)."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    return Path(location)


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3: the AWS SDK's environment names. `endpoint` set: an S3-compatible server
    addressed path-style (MinIO); unset: AWS, virtual-hosted."""

    access_key: str | None
    secret_key: str | None
    session_token: str | None
    region: str
    endpoint: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> S3Settings:
        return cls(
            access_key=environ.get("AWS_ACCESS_KEY_ID"),
            secret_key=environ.get("AWS_SECRET_ACCESS_KEY"),
            session_token=environ.get("AWS_SESSION_TOKEN"),
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            endpoint=environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL"),
        )

    def delta_rs_options(self) -> dict[str, str]:
        """The same settings as delta-rs (`deltalake`) storage options."""
        options = {"AWS_REGION": self.region}
        if self.access_key and self.secret_key:
            options |= {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        if self.endpoint:
            options |= {"AWS_ENDPOINT_URL": self.endpoint, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        return options


class S3Storage(ObjectStorage):
    """A table folder under an S3 prefix (`s3://bucket/path`); the create is a SigV4-signed conditional PUT
    (`If-None-Match: *`)."""

    def __init__(self, location: str, settings: S3Settings | None = None) -> None:
        parsed = urlparse(location)
        super().__init__(location, parsed.netloc, parsed.path)
        self.settings = settings or S3Settings.from_env()

    def _filesystem(self) -> FileSystem:
        from pyarrow.fs import S3FileSystem

        s = self.settings
        endpoint = urlparse(s.endpoint) if s.endpoint else None
        return S3FileSystem(
            access_key=s.access_key,
            secret_key=s.secret_key,
            session_token=s.session_token,
            region=s.region,
            endpoint_override=endpoint.netloc if endpoint else None,
            scheme=endpoint.scheme if endpoint else "https",
            force_virtual_addressing=endpoint is None,
        )

    def list_after(self, relative: str, after: str) -> dict[str, int]:
        """The objects directly in `relative` whose names sort after `after` (name → LastModified, ms): ONE
        ListObjectsV2 with `start-after` per 1000 keys, so reading the tail of a long `_delta_log` costs as
        much as the tail (pyarrow's listing has no `start-after`). Sub-folders are not listed."""
        from icefall.commit.s3_list import list_objects_after

        prefix = f"{self._key(relative)}/"
        found = list_objects_after(self.settings, self.bucket, prefix, prefix + after)
        return {key[len(prefix) :]: ms for key, ms in found.items()}

    def _create(self, key: str, data: bytes) -> Created:
        s = self.settings
        if s.endpoint:
            base, path = s.endpoint, f"/{self.bucket}/{key}"
        else:
            base, path = f"https://{self.bucket}.s3.{s.region}.amazonaws.com", f"/{key}"
        headers = {"If-None-Match": "*", "Content-Type": "application/json"}
        payload = hashlib.sha256(data).hexdigest()
        headers |= sigv4_headers(
            "PUT",
            urlparse(base).netloc,
            quote(path),
            "",
            payload_sha256=payload,
            s=s,
            signed={"if-none-match": "*"},
        )
        status, body = http_request("PUT", base, quote(path), data, headers=headers)
        if status == _IN_FLIGHT:
            return Created.IN_FLIGHT
        if status == _EXISTS:
            return Created.NO
        if 200 <= status < 300:
            return Created.YES
        raise OSError(f"PUT s3://{self.bucket}/{key}: HTTP {status}: {body[:300]!r}")


def delta_rs_options(location: str) -> dict[str, str] | None:
    """delta-rs's storage options for the table at `location` (None: local, none needed)."""
    if is_s3(location):
        return S3Settings.from_env().delta_rs_options()
    from icefall.commit.delta_cloud import AzureSettings, GcsSettings

    if location.startswith(GCS_SCHEMES):
        return GcsSettings.from_env().delta_rs_options()
    if location.startswith(AZURE_SCHEMES):
        return AzureSettings.from_env(location).delta_rs_options()
    return None


def storage_for(location: str) -> DeltaStorage:
    """The store of the table at `location`: local, S3, GCS or Azure by its scheme."""
    if is_s3(location):
        return S3Storage(location)
    from icefall.commit.delta_cloud import AzureStorage, GcsStorage

    if location.startswith(GCS_SCHEMES):
        return GcsStorage(location)
    if location.startswith(AZURE_SCHEMES):
        return AzureStorage(location)
    return LocalStorage(location)
