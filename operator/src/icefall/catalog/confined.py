"""pyiceberg clients that load only Icefall's code: nothing a table, a spec or a catalog endpoint names.

`CatalogConfig.pyiceberg()` builds these instead of pyiceberg's own classes:
- `rest_catalog`: a REST catalog's `/v1/config` answer (`defaults` and `overrides`) is merged as
  pyiceberg merges it, then every key that names code (`icefall.api.code_properties`: `py-io-impl`,
  `*-impl`, `*.class`, ...) and every value that is not text (pyiceberg's `auth` block names an AuthManager
  class) is dropped; Icefall's own choices (its `py-io-impl`) stand. A table response's `config` is
  cleaned the same way.
- both it and `sql_catalog`: the properties a table brings to its FileIO (its metadata's
  properties, a REST table's config and vended storage credentials) lose those keys, so the FileIO is the
  one Icefall chose (`py-io-impl` of `CatalogConfig`) or pyiceberg's own for the location's scheme.
Each dropped key is logged once per client: its name and where it came from, never its value.

`confine_pyiceberg(file_ios)` (idempotent; `CatalogConfig.pyiceberg()` calls it first) narrows pyiceberg's
class loaders that table metadata reaches, process-wide: a FileIO class must be one Icefall chooses, and a
table's `write.py-location-provider.impl` is refused with an error naming the property (pyiceberg would
import it on every commit).

Iceberg Java (Spark's catalog, in the driver and compaction pods) merges a REST catalog's `/v1/config`
answer and table config into its own properties the same way: `icefall.catalog.rest_proxy` filters those
answers for it, with the same predicate.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pyiceberg.typedef import EMPTY_DICT

from icefall.api.code_properties import code_property_problem

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import StagedTable, Table
    from pyiceberg.typedef import Properties

_LoadFileIO = Callable[[str, "Properties"], "FileIO | None"]

log = logging.getLogger(__name__)

LOCATION_PROVIDER_PROPERTY = "write.py-location-provider.impl"
_ALLOWED_FILE_IOS: set[str] = set()
_original: dict[str, _LoadFileIO] = {}  # pyiceberg's own loader, called for the allowed classes
_lock = threading.Lock()


class _Dropper:
    """Removes the keys that name code from what a table or an endpoint says; logs each key once."""

    def __init__(self, catalog: str) -> None:
        self.catalog = catalog
        self.logged: set[tuple[str, str]] = set()

    def clean(self, properties: Mapping[str, Any], source: str) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in properties.items():
            if not isinstance(value, str):
                self.dropped(key, source, "its value is not text")
            elif code_property_problem(key, value) is not None:
                self.dropped(key, source, "it names code to load")
            else:
                kept[key] = value
        return kept

    def dropped(self, key: str, source: str, why: str) -> None:
        if (key, source) not in self.logged:
            self.logged.add((key, source))
            log.warning(
                "catalog %r: ignored %s from %s: %s, and Icefall never loads code a table or an endpoint "
                "names",
                self.catalog,
                key,
                source,
                why,
            )


def rest_catalog(
    name: str, properties: Mapping[str, str], *, request_timeout: float | None = None
) -> Catalog:
    """pyiceberg's `RestCatalog`, deaf to the classes its endpoint and its tables name (module docstring),
    every request bounded to `request_timeout` seconds when given (`icefall.catalog.timeouts`). It fetches
    a token and /v1/config at once: a refusal raises here."""
    rest = _rest_class()
    if request_timeout is not None:
        from icefall.catalog.timeouts import bounded_rest_catalog

        rest = bounded_rest_catalog(rest, request_timeout)
    return rest(name, **properties)


def sql_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """pyiceberg's `SqlCatalog`, deaf to the classes its tables' metadata names (module docstring)."""
    return _sql_class()(name, **properties)


# The classes are made on first use, so a process imports only the client it opens (SQLAlchemy for a sql
# catalog, requests for a rest one: tens of MiB each).


@functools.cache
def _rest_class() -> type[Catalog]:
    from pyiceberg.catalog.rest import RestCatalog, TableResponse

    class ConfinedRestCatalog(RestCatalog):
        def __init__(self, name: str, **properties: str) -> None:
            self._own = dict(properties)  # before super(): its __init__ fetches /v1/config
            self._dropper = _Dropper(name)
            super().__init__(name, **properties)

        def _fetch_config(self) -> None:
            super()._fetch_config()
            changed = {k: v for k, v in self.properties.items() if self._own.get(k) != v}
            kept = self._dropper.clean(changed, "its /v1/config answer")
            # What Icefall set itself stands where the answer's value is dropped (e.g. py-io-impl).
            own = {k: v for k, v in self._own.items() if k not in kept}
            self.properties = {**kept, **own}

        def _load_file_io(self, properties: Properties = EMPTY_DICT, location: str | None = None) -> FileIO:
            source = "a table's properties, config or storage credentials"
            return super()._load_file_io(self._dropper.clean(properties, source), location)

        def _response_to_table(self, identifier_tuple: tuple[str, ...], response: TableResponse) -> Table:
            return super()._response_to_table(identifier_tuple, self._cleaned(response))

        def _response_to_staged_table(
            self, identifier_tuple: tuple[str, ...], response: TableResponse
        ) -> StagedTable:
            return super()._response_to_staged_table(identifier_tuple, self._cleaned(response))

        def _cleaned(self, response: TableResponse) -> TableResponse:
            config = self._dropper.clean(response.config, "a table response's config")
            return response.model_copy(update={"config": config})

    return ConfinedRestCatalog


@functools.cache
def _sql_class() -> type[Catalog]:
    from pyiceberg.catalog.sql import SqlCatalog

    class ConfinedSqlCatalog(SqlCatalog):
        def __init__(self, name: str, **properties: str) -> None:
            self._dropper = _Dropper(name)
            super().__init__(name, **properties)

        def _load_file_io(self, properties: Properties = EMPTY_DICT, location: str | None = None) -> FileIO:
            return super()._load_file_io(self._dropper.clean(properties, "a table's properties"), location)

    return ConfinedSqlCatalog


def confine_pyiceberg(file_ios: Iterable[str]) -> None:
    """Make pyiceberg load only the FileIO classes `file_ios` (added to those of earlier calls) and no
    location provider a table names, in this whole process (module docstring)."""
    import pyiceberg.io
    import pyiceberg.table.locations

    with _lock:
        _ALLOWED_FILE_IOS.update(file_ios)
        load_file_io = pyiceberg.io._import_file_io  # fails loudly if a pyiceberg upgrade renames it
        if load_file_io is _load_allowed_file_io:
            return
        _original["file_io"] = load_file_io
        assert callable(pyiceberg.table.locations._import_location_provider)
        setattr(pyiceberg.io, "_import_file_io", _load_allowed_file_io)  # noqa: B010 (a private name)
        setattr(pyiceberg.table.locations, "_import_location_provider", _no_location_provider)  # noqa: B010


def _load_allowed_file_io(io_impl: str, properties: Properties) -> FileIO | None:
    if io_impl not in _ALLOWED_FILE_IOS:
        raise ValueError(
            "py-io-impl names a FileIO class Icefall did not choose: Icefall never loads code a table or an "
            "endpoint names (see docs/security.md)"
        )
    return _original["file_io"](io_impl, properties)


def _no_location_provider(impl: str, table_location: str, table_properties: Properties) -> None:
    raise ValueError(
        f"the table property {LOCATION_PROVIDER_PROPERTY} names a class: Icefall never loads code a table "
        "names (see docs/security.md); remove the property from the table"
    )
