"""Delta tables on Google Cloud Storage (`gs://bucket/path`) and Azure storage
(`abfss://container@account.dfs.core.windows.net/path`): `icefall.commit.object_storage.ObjectStorage` with
each store's create-only write (commit/DESIGN.md, "Delta tables on GCS and Azure").

- GCS: the JSON API's media upload with `ifGenerationMatch=0` ("only if no live object has this name"):
  412 when the object exists. Settings from Google's own environment names (`GcsSettings.from_env`):
  `STORAGE_EMULATOR_HOST` (what Google's client libraries read) points at an emulator and sends no
  credentials; without it pyarrow's client finds Google's default credentials itself (Workload Identity on
  GKE, GOOGLE_APPLICATION_CREDENTIALS), and the upload takes a token from the metadata server
  (`GCE_METADATA_HOST`, else metadata.google.internal: Workload Identity on GKE, a VM's service account).
- Azure: Put Blob with `If-None-Match: *`: 409 `BlobAlreadyExists` (or 412) when the blob exists. The
  account is the location's host's first label; the Blob endpoint is `https://<account>.blob.<rest of the
  host after dfs.>`, or `AZURE_STORAGE_ENDPOINT` (an emulator's `http://127.0.0.1:10000/devstoreaccount1`,
  a sovereign cloud's); the credential `AZURE_STORAGE_ACCOUNT_KEY` (Shared Key) or
  `AZURE_STORAGE_SAS_TOKEN`: delta-rs's names (`icefall verify` reads with the same ones).

Both take their credentials from the process environment only (a pod's from a Secret by reference).
Guarantees: `ObjectStorage`'s (put-if-absent is True for exactly one of any number of concurrent creators;
errors name the location). Both emulators (fake-gcs-server, Azurite) were checked to honour the conditions
(tests/integration/test_delta_objectstores.py). Not done: an Azure table without a key or SAS token (Azure
workload identity needs a token exchange the create does not make yet: refused with the fix), GCS service
account key files for the create (tokens come from the metadata server only).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote, urlparse

from icefall.commit.object_storage import Created, ObjectStorage, http_request

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

GCS_API = "https://storage.googleapis.com"
GCS_RETRY_SECONDS = 20  # pyarrow's GCS client retries 15 minutes by default (icefall.catalog.gcs_io)
_METADATA_TOKEN = "/computeMetadata/v1/instance/service-accounts/default/token"
AZURE_API_VERSION = "2021-08-06"
_AZURE_LOCATION = re.compile(
    r"^abfss?://(?P<container>[^@/]+)@(?P<account>[^./]+)\.(?P<rest>[^/]+)(?P<path>/.*)?$"
)


@dataclass(frozen=True)
class GcsSettings:
    """How to reach GCS (module doc). `emulator`: its `http://host:port`, no credentials."""

    emulator: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> GcsSettings:
        host = environ.get("STORAGE_EMULATOR_HOST") or None
        if host and "://" not in host:
            host = f"http://{host}"
        return cls(emulator=host.rstrip("/") if host else None)

    def delta_rs_options(self) -> dict[str, str]:
        if not self.emulator:
            return {}
        options = {"google_base_url": self.emulator, "google_skip_signature": "true"}
        return options | ({"allow_http": "true"} if self.emulator.startswith("http://") else {})


class GcsStorage(ObjectStorage):
    """A table folder under a GCS prefix (`gs://bucket/path`)."""

    def __init__(self, location: str, settings: GcsSettings | None = None) -> None:
        parsed = urlparse(location)
        super().__init__(location, parsed.netloc, parsed.path)
        self.settings = settings or GcsSettings.from_env()

    def _filesystem(self) -> FileSystem:
        from pyarrow.fs import GcsFileSystem

        limit = datetime.timedelta(seconds=GCS_RETRY_SECONDS)
        emulator = self.settings.emulator
        if emulator:
            url = urlparse(emulator)
            return GcsFileSystem(
                anonymous=True, scheme=url.scheme, endpoint_override=url.netloc, retry_time_limit=limit
            )
        return GcsFileSystem(retry_time_limit=limit)

    def _create(self, key: str, data: bytes) -> Created:
        base = self.settings.emulator or GCS_API
        path = (
            f"/upload/storage/v1/b/{quote(self.bucket, safe='')}/o?uploadType=media&ifGenerationMatch=0"
            f"&name={quote(key, safe='')}"
        )
        headers = {"Content-Type": "application/json"}
        if not self.settings.emulator:
            headers["Authorization"] = f"Bearer {metadata_token()}"
        status, body = http_request("POST", base, path, data, headers=headers)
        if status == 412:
            return Created.NO
        if 200 <= status < 300:
            return Created.YES
        raise OSError(f"create gs://{self.bucket}/{key}: HTTP {status}: {body[:300]!r}")


_token: dict[str, tuple[str, float]] = {}  # the metadata server's token and when to fetch another
_token_lock = threading.Lock()


def metadata_token(environ: Mapping[str, str] = os.environ) -> str:
    """An OAuth2 access token of the pod's (or VM's) Google service account, from the metadata server;
    kept until a minute before it expires."""
    host = environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    with _token_lock:
        if (held := _token.get(host)) is not None and held[1] > time.monotonic():
            return held[0]
        try:
            status, body = http_request(
                "GET",
                f"http://{host}",
                _METADATA_TOKEN,
                b"",
                headers={"Metadata-Flavor": "Google"},
                timeout=10,
            )
        except OSError as error:
            raise OSError(
                f"no Google credentials for a Delta commit: the metadata server {host} did not answer "
                f"({error}); run the pod with Workload Identity, or set STORAGE_EMULATOR_HOST for an emulator"
            ) from None
        if status != 200:
            raise OSError(f"the metadata server {host} refused a token: HTTP {status}: {body[:200]!r}")
        answer = json.loads(body)
        _token[host] = answer["access_token"], time.monotonic() + int(answer.get("expires_in", 300)) - 60
        return _token[host][0]


@dataclass(frozen=True)
class AzureSettings:
    """How to reach the Azure storage account of one location (module doc); `repr` hides the secrets."""

    account: str
    endpoint: str  # the Blob service's, e.g. https://<account>.blob.core.windows.net
    key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, location: str, environ: Mapping[str, str] = os.environ) -> AzureSettings:
        _, account, host, _ = azure_parts(location)
        default = f"https://{account}.{re.sub(r'^dfs[.]', 'blob.', host)}"
        return cls(
            account=account,
            endpoint=(environ.get("AZURE_STORAGE_ENDPOINT") or default).rstrip("/"),
            key=environ.get("AZURE_STORAGE_ACCOUNT_KEY") or None,
            sas_token=(environ.get("AZURE_STORAGE_SAS_TOKEN") or "").lstrip("?") or None,
        )

    def delta_rs_options(self) -> dict[str, str]:
        options = {"azure_storage_account_name": self.account, "azure_storage_endpoint": self.endpoint}
        if self.key:
            options["azure_storage_account_key"] = self.key
        if self.sas_token:
            options["azure_storage_sas_token"] = self.sas_token
        return options | ({"allow_http": "true"} if self.endpoint.startswith("http://") else {})


def azure_parts(location: str) -> tuple[str, str, str, str]:
    """(container, account, the host after `<account>.`, path) of `abfss://container@account.host/path`."""
    match = _AZURE_LOCATION.match(location)
    if match is None:
        raise ValueError(
            f"{location!r} is not an Azure location: abfss://<container>@<account>.dfs.core.windows.net/<path>"
        )
    return match["container"], match["account"], match["rest"], (match["path"] or "").strip("/")


class AzureStorage(ObjectStorage):
    """A table folder in an Azure container (`abfss://container@account.dfs.core.windows.net/path`)."""

    def __init__(self, location: str, settings: AzureSettings | None = None) -> None:
        container, _, _, path = azure_parts(location)
        super().__init__(location, container, path)
        self.settings = settings or AzureSettings.from_env(location)

    def _filesystem(self) -> FileSystem:
        from pyarrow.fs import AzureFileSystem

        s = self.settings
        url = urlparse(s.endpoint)
        # pyarrow addresses `<account>.<authority>`, or a loopback authority path-style (`/<account>`).
        authority = url.netloc.removeprefix(f"{s.account}.")
        secret = {"account_key": s.key} if s.key else {"sas_token": s.sas_token} if s.sas_token else {}
        return AzureFileSystem(
            s.account,
            blob_storage_authority=authority,
            blob_storage_scheme=url.scheme,
            dfs_storage_authority=authority.replace("blob.", "dfs.", 1),
            dfs_storage_scheme=url.scheme,
            **secret,
        )

    def _create(self, key: str, data: bytes) -> Created:
        s = self.settings
        url = urlparse(s.endpoint)
        path = f"{url.path}/{quote(self.bucket)}/{quote(key)}"
        headers = {
            "Content-Type": "application/json",
            "If-None-Match": "*",
            "x-ms-blob-type": "BlockBlob",
            "x-ms-date": datetime.datetime.now(datetime.UTC).strftime("%a, %d %b %Y %H:%M:%S GMT"),
            "x-ms-version": AZURE_API_VERSION,
        }
        if s.key:
            headers["Authorization"] = shared_key("PUT", path, headers, len(data), s)
        elif s.sas_token:
            path = f"{path}?{s.sas_token}"
        else:
            raise OSError(
                f"create {self.location}: no Azure credential; set AZURE_STORAGE_ACCOUNT_KEY or "
                "AZURE_STORAGE_SAS_TOKEN (e.g. spec.pods.driver.env with valueFrom.secretKeyRef)"
            )
        status, body = http_request("PUT", f"{url.scheme}://{url.netloc}", path, data, headers=headers)
        if status == 412 or (status == 409 and b"BlobAlreadyExists" in body):
            return Created.NO
        if 200 <= status < 300:
            return Created.YES
        raise OSError(f"create {self.location} ({self.bucket}/{key}): HTTP {status}: {body[:300]!r}")


def shared_key(method: str, path: str, headers: Mapping[str, str], length: int, s: AzureSettings) -> str:
    """The `Authorization` of a Blob request without a query (`path` encoded, from the endpoint's root):
    Azure's Shared Key signature over the standard headers, the `x-ms-*` ones and the resource."""
    lower = {k.lower(): v for k, v in headers.items()}
    standard = [
        "content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
        "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range",
    ]  # fmt: skip
    values = [str(length or "") if name == "content-length" else lower.get(name, "") for name in standard]
    ms_headers = "".join(f"{k}:{lower[k]}\n" for k in sorted(lower) if k.startswith("x-ms-"))
    to_sign = "\n".join([method, *values]) + "\n" + ms_headers + f"/{s.account}{path}"
    signature = hmac.new(base64.b64decode(s.key or ""), to_sign.encode(), hashlib.sha256).digest()
    return f"SharedKey {s.account}:{base64.b64encode(signature).decode()}"
