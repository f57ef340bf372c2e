"""The test stack's catalog servers are real: PostgreSQL under pyiceberg's SqlCatalog, and the Iceberg
project's REST catalog server under pyiceberg's RestCatalog.

Proves: tables round-trip through both; the REST server itself refuses a commit whose
`assert-ref-snapshot-id` requirement is stale (HTTP 409 with Iceberg's own message, no client-side retry in
between) and accepts the same update with a current requirement; a REST server backed by PostgreSQL and a
SqlCatalog on the same database see each other's tables; both servers come back with their data on the
same address after `stop()`/`start()`. Does not prove: S3 warehouses (local folders here).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import AssertRefSnapshotId, SetPropertiesUpdate

from icefall.devstack.postgres import PostgresServer
from icefall.devstack.rest_catalog import RESTCatalogServer

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
# pyiceberg re-applies an append refused for a concurrent update; the tests must see the refusal itself.
NO_CLIENT_RETRY = {"commit.retry.num-retries": "0"}


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def ids(table: Table) -> list[int]:
    return sorted(table.refresh().scan().to_arrow()["id"].to_pylist())


def rest_client(server: RESTCatalogServer) -> RestCatalog:
    return RestCatalog(server.catalog_name, uri=server.uri)


def round_trip(catalog: Catalog, name: str) -> Table:
    namespace = name.split(".", maxsplit=1)[0]
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table(name, schema=SCHEMA)
    table.append(rows(1, 2))
    table.append(rows(3))
    assert ids(catalog.load_table(name)) == [1, 2, 3]
    assert len(catalog.load_table(name).snapshots()) == 2
    return table


def test_sql_catalog_on_postgres_round_trips_a_table(postgres: PostgresServer, tmp_path: Path) -> None:
    uri = postgres.create_database("sql_round_trip")
    catalog = SqlCatalog("icefall", uri=uri, warehouse=tmp_path.as_uri())
    table = round_trip(catalog, "pg.events")
    # The pointer to the current metadata lives in PostgreSQL, where a JDBC catalog would look for it.
    with sa.create_engine(uri).connect() as conn:
        stored = conn.execute(
            sa.text("SELECT metadata_location FROM iceberg_tables WHERE table_name = 'events'")
        ).scalar_one()
    assert stored == table.metadata_location


def test_postgres_comes_back_with_its_data_after_an_outage(postgres: PostgresServer) -> None:
    engine = sa.create_engine(postgres.create_database("outage"))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE kept (x int)"))
        conn.execute(sa.text("INSERT INTO kept VALUES (42)"))
    uri = postgres.sqlalchemy_uri
    postgres.stop()
    try:
        with pytest.raises(sa.exc.OperationalError), engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    finally:
        postgres.start()
    assert postgres.sqlalchemy_uri == uri
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT x FROM kept")).scalar_one() == 42


def test_rest_catalog_round_trips_a_table(rest_catalog: RESTCatalogServer) -> None:
    round_trip(rest_client(rest_catalog), "rest.events")
    # A second client (no shared state with the first) sees the same table.
    assert ids(rest_client(rest_catalog).load_table("rest.events")) == [1, 2, 3]


def test_rest_catalog_refuses_a_commit_on_a_stale_snapshot(rest_catalog: RESTCatalogServer) -> None:
    catalog = rest_client(rest_catalog)
    catalog.create_namespace_if_not_exists("occ")
    catalog.create_table("occ.events", schema=SCHEMA, properties=NO_CLIENT_RETRY).append(rows(1, 2))
    first, second = catalog.load_table("occ.events"), catalog.load_table("occ.events")
    old = first.current_snapshot().snapshot_id
    first.append(rows(3))
    new = first.current_snapshot().snapshot_id
    # Java's message ("expected id X != Y"), not pyiceberg's ("expected id X, found Y"): the server refused.
    refused = f"branch main has changed: expected id {old} != {new}"

    with pytest.raises(CommitFailedException, match=refused):
        second.append(rows(4))
    with pytest.raises(CommitFailedException, match=refused):
        catalog.commit_table(
            second,
            requirements=(AssertRefSnapshotId(ref="main", snapshot_id=old),),
            updates=(SetPropertiesUpdate(updates={"written-by": "stale"}),),
        )
    # The same kind of update with a current requirement is accepted: only the stale one was refused.
    catalog.commit_table(
        second,
        requirements=(AssertRefSnapshotId(ref="main", snapshot_id=new),),
        updates=(SetPropertiesUpdate(updates={"written-by": "current"}),),
    )

    final = catalog.load_table("occ.events")
    assert ids(final) == [1, 2, 3]
    assert [s.snapshot_id for s in final.snapshots()][-1] == new
    assert len(final.snapshots()) == 2
    assert final.properties["written-by"] == "current"


def test_rest_catalog_on_postgres_shares_tables_with_a_sql_catalog(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    database = "rest_backend"
    postgres.create_database(database)
    server = RESTCatalogServer(
        tmp_path / "rest",
        jdbc_uri=postgres.jdbc_url_for(database),
        jdbc_user=postgres.user,
        jdbc_password=postgres.password,
        warehouse=(tmp_path / "warehouse").as_uri(),
        catalog_name="shared",
    ).start()
    try:
        rest = rest_client(server)
        rest.create_namespace("both")
        rest.create_table("both.events", schema=SCHEMA).append(rows(1))
        sql = SqlCatalog("shared", uri=postgres.sqlalchemy_uri_for(database))
        via_sql = sql.load_table("both.events")
        assert ids(via_sql) == [1]
        via_sql.append(rows(2))
        assert ids(rest.load_table("both.events")) == [1, 2]
    finally:
        server.stop()


def test_rest_catalog_comes_back_with_its_tables_after_an_outage(rest_catalog: RESTCatalogServer) -> None:
    catalog = rest_client(rest_catalog)
    catalog.create_namespace_if_not_exists("outage")
    catalog.create_table("outage.events", schema=SCHEMA).append(rows(7))
    uri = rest_catalog.uri
    rest_catalog.stop()
    try:
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{uri}/v1/config", timeout=5)
    finally:
        rest_catalog.start()
    assert rest_catalog.uri == uri
    assert ids(rest_client(rest_catalog).load_table("outage.events")) == [7]
