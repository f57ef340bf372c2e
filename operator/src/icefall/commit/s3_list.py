"""S3's ListObjectsV2 with `start-after`: the keys after a given one, in key order (pyarrow's listing has
no `start-after`). Used to read only the tail of a Delta log (`delta_storage.S3Storage.list_after`).

A signed GET (AWS Signature Version 4, the settings of `S3Settings`) per page of 1000 keys, following
`NextContinuationToken`; `delimiter=/` so sub-folders (`_delta_log/_staged_commits/`) are not walked.
Guarantees: every key that existed under the prefix after `start_after` when the listing began and still
exists at its end is listed once (S3's LIST is strongly consistent); a failure raises OSError.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import quote, urlparse

from icefall.commit.object_storage import http_request


class S3Settings(Protocol):
    """What a request needs of `icefall.commit.delta_storage.S3Settings` (no import: it imports this)."""

    @property
    def access_key(self) -> str | None: ...
    @property
    def secret_key(self) -> str | None: ...
    @property
    def session_token(self) -> str | None: ...
    @property
    def region(self) -> str: ...
    @property
    def endpoint(self) -> str | None: ...


_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PAGES = 10_000


def list_objects_after(settings: S3Settings, bucket: str, prefix: str, start_after: str) -> dict[str, int]:
    """The keys under `prefix` (not in sub-folders) sorting after `start_after`: key → LastModified, ms."""
    found: dict[str, int] = {}
    token: str | None = None
    for _ in range(MAX_PAGES):
        query = {"list-type": "2", "prefix": prefix, "delimiter": "/", "start-after": start_after}
        if token is not None:
            query["continuation-token"] = token
        page = _get(settings, bucket, query)
        for item in page.iter(f"{_NS}Contents"):
            key, modified = item.findtext(f"{_NS}Key"), item.findtext(f"{_NS}LastModified")
            if key is not None and modified is not None:
                found[key] = _ms(modified)
        token = page.findtext(f"{_NS}NextContinuationToken")
        if page.findtext(f"{_NS}IsTruncated") != "true" or not token:
            return found
    raise OSError(f"LIST s3://{bucket}/{prefix}: more than {MAX_PAGES} pages")


def _ms(text: str) -> int:
    """An S3 timestamp (ISO 8601, `Z`) in ms since the epoch."""
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp() * 1000)


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def _get(settings: S3Settings, bucket: str, query: dict[str, str]) -> ET.Element:
    s = settings
    if s.endpoint:
        endpoint = urlparse(s.endpoint)
        scheme, host, path = endpoint.scheme, endpoint.netloc, f"/{bucket}"
    else:
        scheme, host, path = "https", f"{bucket}.s3.{s.region}.amazonaws.com", "/"
    canonical_query = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in sorted(query.items()))
    headers = sigv4_headers("GET", host, path, canonical_query, payload_sha256=_EMPTY_SHA256, s=s)
    target = f"{path}?{canonical_query}"
    status, body = http_request("GET", f"{scheme}://{host}", target, b"", headers=headers)
    if status != 200:
        raise OSError(f"LIST s3://{bucket}/{query['prefix']}: HTTP {status}: {body[:300]!r}")
    return ET.fromstring(body)


def sigv4_headers(
    method: str,
    host: str,
    path: str,
    canonical_query: str,
    *,
    payload_sha256: str,
    s: S3Settings,
    signed: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """AWS Signature Version 4 headers of a request to `path?canonical_query` (both URI-encoded) whose body
    hashes to `payload_sha256`; `signed` (lower-case names): headers the caller sends itself, signed too.
    Anonymous (no keys): no signature."""
    now = datetime.datetime.now(datetime.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    extra = dict(signed or {})
    headers = {"host": host, **extra, "x-amz-content-sha256": payload_sha256, "x-amz-date": amz_date}
    if s.session_token:
        headers["x-amz-security-token"] = s.session_token
    result = {k: v for k, v in headers.items() if k != "host" and k not in extra}
    if not (s.access_key and s.secret_key):
        return result
    names = ";".join(sorted(headers))
    lines = [method, path, canonical_query, *(f"{k}:{headers[k]}" for k in sorted(headers)), "", names]
    canonical = "\n".join([*lines, payload_sha256])
    scope = f"{day}/{s.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{s.secret_key}".encode()
    for part in (day, s.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    result["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={s.access_key}/{scope}, SignedHeaders={names}, Signature={signature}"
    )
    return result
