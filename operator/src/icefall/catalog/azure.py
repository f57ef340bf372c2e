"""Tables in Azure storage (ADLS Gen2 / Blob): one set of `adls.*` properties for pyiceberg and Spark.

Locations are written the way Iceberg's Java `ADLSFileIO` wants them:
`abfss://<container>@<account>.dfs.core.windows.net/<path>` (also `abfs`, `wasb`, `wasbs`). Both sides see
and store that exact spelling, so orphan removal compares paths as strings.

- pyiceberg: `azure_io.AzureFileIO`, a `PyArrowFileIO` whose path inside the file system is
  `<container>/<path>` (pyiceberg 0.12 hands pyarrow's `AzureFileSystem` `<container>@<host>/<path>`, which
  names no container).
  It reads pyiceberg's own names: `adls.account-name`, `adls.account-key`, `adls.sas-token`,
  `adls.blob-storage-authority`, `adls.dfs-storage-authority` and their `-scheme`s, ...
- Spark (`java_properties`): `ADLSFileIO`, with `adls.auth.shared-key.account.name/key` from
  `adls.account-name/key`, and, when a DFS authority is given (an emulator or a sovereign cloud), the
  account's endpoint as `adls.connection-string.<account host>`: path-style
  (`<scheme>://<authority>/<account>`) for a loopback or IP authority, as pyarrow addresses an emulator,
  else `<scheme>://<account>.<authority>`.

Without a key or SAS token both sides use Azure's default credential chain (workload identity on AKS):
nothing secret is needed in the spec. A key, when used, comes by Secret reference (`secretProperties`).
Not guaranteed: `wasb(s)://` locations are accepted and spelled alike, but only `abfss://` is tested.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

AZURE_SCHEMES = ("abfs", "abfss", "wasb", "wasbs")
ADLS_FILE_IO = "org.apache.iceberg.azure.adlsv2.ADLSFileIO"
PY_AZURE_FILE_IO = "icefall.catalog.azure_io.AzureFileIO"  # imports pyarrow: a module of its own


def is_azure_location(location: str | None) -> bool:
    return bool(location) and urlsplit(location or "").scheme.lower() in AZURE_SCHEMES


def split_location(location: str) -> tuple[str, str]:
    """(`<scheme>://<container>@<host>/`, `<container>/<path>`): the prefix that turns a path inside
    pyarrow's `AzureFileSystem` back into the location's own spelling, and that inner path."""
    scheme, _, rest = location.partition("://")
    authority, _, path = rest.partition("/")
    container = authority.split("@", 1)[0]
    return f"{scheme}://{authority}/", f"{container}/{path}".rstrip("/")


def account_host(location: str) -> str:
    """`<account>.dfs.core.windows.net` of an `abfss://container@<account host>/...` location."""
    return urlsplit(location).netloc.rpartition("@")[2]


def java_properties(props: Mapping[str, str], warehouse: str | None) -> dict[str, str]:
    """Iceberg Java's ADLSFileIO properties derived from pyiceberg's `adls.*` names (module doc); keys
    already in `props` win (the caller applies these with setdefault)."""
    out = {"io-impl": ADLS_FILE_IO}
    account = props.get("adls.account-name")
    if account:
        out["adls.auth.shared-key.account.name"] = account
    if props.get("adls.account-key"):
        out["adls.auth.shared-key.account.key"] = props["adls.account-key"]
    authority = props.get("adls.dfs-storage-authority")
    if authority and account:
        scheme = props.get("adls.dfs-storage-scheme", "https")
        host = authority.rsplit(":", 1)[0].strip("[]")
        endpoint = (
            f"{scheme}://{authority}/{account}"
            if _is_loopback_or_ip(host)
            else f"{scheme}://{account}.{authority}"
        )
        hosts = {f"{account}.dfs.core.windows.net"}
        if is_azure_location(warehouse):
            hosts.add(account_host(warehouse or ""))
        for name in hosts:
            out[f"adls.connection-string.{name}"] = endpoint
    return out


def _is_loopback_or_ip(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
