"""`icefall purge`: drop a StreamingTable's Iceberg table, its dead-letter table and its route tables
(`spec.routes`), metadata and files, only when each is the very table recorded for it. The command of the
purge Job (`deletionPolicy: Delete`, `icefall.plan.purge`), run with the table's own credentials in its
namespace; `-f` runs it here.

Each table is identified by the catalog's own identity, its Iceberg `table-uuid`: `--table-uuid` (and
`--dead-letter-table-uuid`, and `--route-table-uuid <table>=<uuid>` per route table) name the tables this
StreamingTable's driver wrote. A table found under the name
with another uuid (one created again, or another StreamingTable's table reached through another name of
the catalog) is refused: nothing at all is dropped, the command says why and exits `EXIT_REFUSED`. A
dead-letter or route table without a recorded uuid is kept (said, not refused). A table already gone counts as
dropped.

The tables the dynamic route made (`spec.dynamicRoute`) are found in the catalog: only those whose
`icefall.dynamic-route-of` names this StreamingTable's table (`owned_dynamic_tables`; a table without it
is never dropped). Each is dropped when its uuid is the one `--route-table-uuid` names, or none is named
(the owner property says whose it is; the driver's status list is bounded), and refused like any table
when another uuid is named.

A Delta table (`spec.table.format: delta`) has no catalog: it is its folder, identified by the `id` of its
log's Metadata action (`--table-uuid`, as its driver reported it; `--dead-letter-table-uuid` for the Delta
dead-letter table beside it). `purge_delta` checks both before it deletes either: a folder whose log has
another id is refused as above, one without a log counts as gone; then every object under each folder goes
(a Delta table owns its folder: VACUUM deletes what its log does not name there too), never a sibling
folder that shares the name's prefix.

Not guaranteed: that the catalog does not swap the table between the check and the drop (pyiceberg drops
by name); likewise a Delta folder written again between the check and the deletion.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

Identifier = tuple[str, ...]


class PurgeRefusedError(RuntimeError):
    """A table under the StreamingTable's name is not the one recorded for it."""


@dataclass(frozen=True)
class Target:
    """A table to drop: its identifier, and the table-uuid recorded for it (None: none recorded)."""

    identifier: Identifier
    table_uuid: str | None
    what: str = "table"
    owned: bool = False  # its owner property names this StreamingTable's table: dropped without a uuid


def purge_tables(catalog: Catalog, targets: list[Target]) -> tuple[list[str], list[str]]:
    """Drop each target whose uuid is the recorded one: (dropped, kept-with-why). Every target is checked
    before anything is dropped: one refusal (`PurgeRefusedError`) drops nothing."""
    from pyiceberg.exceptions import NoSuchTableError

    due: list[Target] = []
    kept: list[str] = []
    for target in targets:
        name = ".".join(target.identifier)
        try:
            found = str(catalog.load_table(target.identifier).metadata.table_uuid)
        except NoSuchTableError:
            continue
        if target.table_uuid is None and not target.owned:
            kept.append(f"the {target.what} {name}: no table-uuid was recorded for it; kept")
            continue
        if target.table_uuid is not None and found != target.table_uuid:
            raise PurgeRefusedError(
                f"refusing to drop the {target.what} {name}: its table-uuid is {found}, but this "
                f"StreamingTable's driver wrote the table {target.table_uuid}. It is another table (created "
                "again under the name, or another StreamingTable's reached through another name of the "
                "catalog); nothing was dropped. Drop it with your catalog's tools if it is to go"
            )
        due.append(target)
    dropped = []
    for target in due:
        try:
            catalog.purge_table(target.identifier)
        except NoSuchTableError:
            continue
        dropped.append(".".join(target.identifier))
    return dropped, kept


def purge_delta(st: Any, location: str, args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """`icefall purge` of the Delta table at `location` and its dead-letter table (module doc); the exit
    code, as `purge`."""
    from icefall.commit.delta import DeltaLog
    from icefall.commit.delta_storage import storage_for
    from icefall.ingest.delta_dead_letters import dead_letter_location
    from icefall.plan.purge import EXIT_REFUSED

    targets = [(location, args.table_uuid, "Delta table")]
    dead = dead_letter_location(st, location)
    if dead is not None:
        targets.append((dead, args.dead_letter_table_uuid, "Delta dead-letter table"))
    due, kept = [], []
    for folder, recorded, what in targets:
        snapshot = DeltaLog(folder).snapshot()
        if not snapshot.exists:
            continue
        found = str((snapshot.metadata or {}).get("id"))
        if recorded is None:
            kept.append(f"the {what} at {folder}: no table id was recorded for it; kept")
        elif found != recorded:
            refused = (
                f"refusing to delete the {what} at {folder}: its log's table id is {found}, but this "
                f"StreamingTable's driver wrote the table {recorded}. It is another table (created again at "
                "the location, or another StreamingTable's); nothing was deleted. Delete the folder yourself "
                "if it is to go"
            )
            print(f"[purge] {refused}", flush=True)
            say(f"PurgeRefused: {refused}")
            return EXIT_REFUSED
        else:
            due.append(folder)
    for folder in due:
        storage_for(folder).delete_all()
    print(f"[purge] deleted {', '.join(due) or 'nothing (the tables did not exist)'}", flush=True)
    for line in kept:
        print(f"[purge] {line}", flush=True)
    return 0


def route_uuids(pairs: list[str]) -> dict[str, str]:
    """`--route-table-uuid` values (`<table>=<uuid>`, the table dotted) by table."""
    found: dict[str, str] = {}
    for pair in pairs:
        table, sep, uuid = pair.rpartition("=")
        if not sep or not table or not uuid:
            raise SystemExit(f"--route-table-uuid {pair!r}: give <namespace>.<table>=<table-uuid>")
        found[table] = uuid
    return found


def purge(args: argparse.Namespace, st: Any, catalog: Catalog, say: Callable[[str], None]) -> int:
    """Run `icefall purge` for `st` on `catalog`; the exit code (`EXIT_REFUSED`: refused, and `say` gets
    why: the container's termination message, read by the operator)."""
    from icefall.catalog.tables import owned_dynamic_tables
    from icefall.plan.purge import EXIT_REFUSED

    targets = [Target(tuple(st.table_identifier), args.table_uuid)]
    if st.dead_letter_identifier is not None:
        targets.append(
            Target(tuple(st.dead_letter_identifier), args.dead_letter_table_uuid, "dead-letter table")
        )
    routes = route_uuids(getattr(args, "route_table_uuid", None) or [])
    for identifier in st.route_identifiers:
        targets.append(Target(tuple(identifier), routes.get(".".join(identifier)), "route table"))
    for identifier, _ in owned_dynamic_tables(catalog, st):
        name = ".".join(identifier)
        targets.append(Target(identifier, routes.get(name), "dynamic route's table", owned=True))
    try:
        dropped, kept = purge_tables(catalog, targets)
    except PurgeRefusedError as refused:
        print(f"[purge] {refused}", flush=True)
        say(f"PurgeRefused: {refused}")
        return EXIT_REFUSED
    print(f"[purge] dropped {', '.join(dropped) or 'nothing (the tables did not exist)'}", flush=True)
    for line in kept:
        print(f"[purge] {line}", flush=True)
    return 0
