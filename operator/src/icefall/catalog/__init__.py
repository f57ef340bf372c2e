"""Iceberg catalogs: one configuration (`CatalogConfig`) for pyiceberg and Spark; the tables Icefall writes.

`icefall.catalog.config` is the one mapping from `spec.table.catalog` to both clients; every entry point
(the CLI's commands, the pods, the operator's observation and deletion) builds its catalog through it.
`icefall.catalog.tables` creates or checks the tables, with the layout of `icefall.catalog.layout` and the
comparison of `icefall.catalog.compare`.
"""

from icefall.catalog.config import CatalogConfig, CatalogConfigError, MissingCredentialError
from icefall.catalog.refusal import CatalogCredentialsRefusedError

__all__ = ["CatalogConfig", "CatalogConfigError", "CatalogCredentialsRefusedError", "MissingCredentialError"]
