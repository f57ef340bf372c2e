"""Resource faults shared by the integration tests and `make chaos`: a network partition on loopback and a
commit from a host whose clock is ahead.

`dropped(ports)`: every TCP packet arriving on loopback to or from `ports` dropped while the block runs
(iptables, one rule tagged with this process's id, always removed on the way out): connections stay open
and new ones time out, as behind a partitioned network, never refused (a DROP on OUTPUT would fail the
sender's connect at once, EPERM, which is a refusal). Needs root.

`commit_from_a_clock_ahead`: a pyiceberg commit (a table property) stamped by a clock `seconds` ahead, as a
writer or maintenance pod elsewhere would make it: the table's `last-updated-ms` is then in this host's
future.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from icefall.catalog import CatalogConfig

CLOCK_AHEAD_PROPERTY = "it.clock-ahead"


def partition_rule(ports: str, tag: str) -> list[str]:
    """The iptables rule (after `-I`/`-D`) that drops loopback TCP to or from `ports` (multiport syntax)."""
    return ["INPUT", "-i", "lo", "-p", "tcp", "-m", "multiport", "--ports", ports,
            "-m", "comment", "--comment", tag, "-j", "DROP"]  # fmt: skip


@contextmanager
def dropped(ports: str, tag: str = "") -> Iterator[None]:
    """Every loopback TCP packet to or from `ports` dropped while the block runs (module doc)."""
    if os.geteuid() != 0:
        raise PermissionError("dropping packets needs root (iptables): run as root, as CI does")
    rule = partition_rule(ports, tag or f"icefall-test-partition-{os.getpid()}")
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)


def commit_from_a_clock_ahead(config: CatalogConfig, identifier: Sequence[str], seconds: int) -> int:
    """A commit of table `identifier` by a host whose clock is `seconds` ahead: a table property set through
    pyiceberg with its clock shifted; the table's new `last-updated-ms`."""
    import pyiceberg.table.update as updates

    class Ahead(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Ahead:
            return super().now(tz) + dt.timedelta(seconds=seconds)

    names = vars(updates)  # pyiceberg stamps its metadata with `datetime.now` of this module
    real = names["datetime"]
    names["datetime"] = Ahead
    try:
        table = config.pyiceberg().load_table(tuple(identifier))
        with table.transaction() as tx:
            tx.set_properties({CLOCK_AHEAD_PROPERTY: str(seconds)})
    finally:
        names["datetime"] = real
    return int(table.refresh().metadata.last_updated_ms)
