"""A REST catalog's refusal of the credentials is recognised in pyiceberg's and Iceberg Java's words and
named as a configuration error: the catalog, its URI and the secretProperties to check, never a value.
The refusal by a real catalog: tests/integration/test_catalog_auth.py."""

from __future__ import annotations

import pytest
from pyiceberg.exceptions import ForbiddenError, NoSuchTableError, OAuthError, UnauthorizedError

from icefall.api import CatalogType
from icefall.catalog import CatalogConfig, CatalogCredentialsRefusedError
from icefall.catalog.refusal import refusal

pytestmark = pytest.mark.unit

SECRET = "client:s3cr3t-value"


def config(**secrets: str) -> CatalogConfig:
    return CatalogConfig(name="lake", type=CatalogType.REST, uri="https://catalog:8181", secrets=secrets)


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (OAuthError("invalid_client: bad secret"), "OAuthError: invalid_client: bad secret"),
        (UnauthorizedError("NotAuthorizedException: expired"), "UnauthorizedError: NotAuthorizedException"),
        (ForbiddenError("ForbiddenException: no grant"), "ForbiddenError: ForbiddenException: no grant"),
        (
            RuntimeError(
                "An error occurred while calling o42.sql.\n: org.apache.iceberg.exceptions."
                "NotAuthorizedException: Not authorized: invalid_client\n\tat org.apache.iceberg..."
            ),
            "NotAuthorizedException: Not authorized: invalid_client",
        ),
    ],
)
def test_refusals_are_recognised_in_both_clients_words(error: Exception, words: str) -> None:
    found = refusal(error)
    assert found is not None and found.startswith(words), found
    assert "\n" not in found
    wrapped = RuntimeError("batch failed")
    wrapped.__cause__ = error
    assert refusal(wrapped) == found  # found through the causes too


@pytest.mark.parametrize(
    "error",
    [NoSuchTableError("it.t"), ConnectionError("refused"), RuntimeError("ServiceUnavailableException")],
)
def test_other_errors_are_not_refusals(error: Exception) -> None:
    assert refusal(error) is None


def test_the_message_names_the_fields_and_never_the_value() -> None:
    error = CatalogCredentialsRefusedError.of(config(credential=SECRET), f"OAuthError: bad {SECRET}")
    text = str(error)
    assert text.startswith("catalog 'lake' at https://catalog:8181 refused the credentials (")
    assert "spec.table.catalog.secretProperties[credential]" in text
    assert SECRET not in text
    both = str(CatalogCredentialsRefusedError.of(config(credential=SECRET, token="t0ken-value"), "401"))
    assert "secretProperties[credential] and spec.table.catalog.secretProperties[token]" in both
    none = str(CatalogCredentialsRefusedError.of(config(), "UnauthorizedError: no token"))
    assert "the catalog needs credentials: add spec.table.catalog.secretProperties[credential]" in none
