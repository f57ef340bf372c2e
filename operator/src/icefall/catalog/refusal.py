"""A catalog that answered and refused the credentials: a configuration error, never an outage.

`refusal(error)` finds, in an exception and its causes, a REST catalog's refusal: pyiceberg's `OAuthError`
(the token endpoint refused the client credentials), `UnauthorizedError` (401: no, unknown or expired
token) and `ForbiddenError` (403), or from the JVM Iceberg Java's `NotAuthorizedException` /
`ForbiddenException` in the Java exception's text. It returns the client's words (one line), or None.

`CatalogCredentialsRefusedError.of(config, detail)` names the catalog, its URI and the spec fields to check
(the credential properties the spec sets, or that none is set). Retrying does not help: the CLI prints it
as one line and exits, the operator shows it as the reason CatalogCredentialsRefused.

Not guaranteed: a catalog that answers a wrong credential with another status (e.g. 404 to hide a
namespace) is not recognised here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class _Catalog(Protocol):
    """What a refusal names of a catalog (a `CatalogConfig`; not imported: config.py imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def secrets(self) -> Mapping[str, str]: ...
    def mask(self, text: str) -> str: ...


#: Catalog properties that authenticate to a REST catalog (secretProperties), in the order named.
CREDENTIAL_KEYS = ("credential", "token")
_PYICEBERG = ("OAuthError", "UnauthorizedError", "ForbiddenError", "AuthorizationExpiredError")
_JAVA = (
    "org.apache.iceberg.exceptions.NotAuthorizedException",
    "org.apache.iceberg.exceptions.ForbiddenException",
)


class CatalogCredentialsRefusedError(RuntimeError):
    """The catalog refused this client's credentials; the message names the fields to check."""

    @classmethod
    def of(cls, config: _Catalog, detail: str) -> CatalogCredentialsRefusedError:
        given = [key for key in CREDENTIAL_KEYS if key in config.secrets]
        if given:
            fields = " and ".join(f"spec.table.catalog.secretProperties[{key}]" for key in given)
            fix = f"check {fields} and the Secret or variable it references"
        else:
            fix = (
                "the catalog needs credentials: add spec.table.catalog.secretProperties[credential] "
                "(OAuth2 client_id:client_secret) or [token] (a bearer token), each a reference"
            )
        where = f"catalog {config.name!r} at {config.uri}"
        return cls(f"{where} refused the credentials ({config.mask(detail)}): {fix}")


def refusal(error: BaseException) -> str | None:
    """The catalog's refusal in `error` or its causes (the client's words, one line), or None."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, CatalogCredentialsRefusedError):
            return str(link)
        kind = type(link)
        if kind.__module__.startswith("pyiceberg") and kind.__name__ in _PYICEBERG:
            return _one_line(f"{kind.__name__}: {link}")
        text = str(link)
        for marker in _JAVA:
            if marker in text:
                rest = text.split(marker, 1)[1].lstrip(": ")
                return _one_line(f"{marker.rsplit('.', 1)[1]}: {rest}")
        link = link.__cause__ or link.__context__
    return None


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    return first[:300]
