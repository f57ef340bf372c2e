"""The bounded memories (`runtime.bounded.LRU`).

Proves: the LRU keeps at most `max_size` entries, drops the least recently used first and hands each
dropped value to `on_evict`; the operator's per-table memory (`StatusMemory`) is bounded by it and forgets
a table that goes.
"""

from __future__ import annotations

import pytest

from icefall.runtime.bounded import LRU

pytestmark = pytest.mark.unit


def test_the_lru_keeps_the_most_recent_entries_and_hands_back_what_it_drops() -> None:
    dropped: list[tuple[str, int]] = []
    lru: LRU[str, int] = LRU(2, lambda key, value: dropped.append((key, value)))
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert dropped == [("b", 2)] and list(lru) == ["a", "c"] and len(lru) == 2
    lru.put("a", 10)  # replacing is a use, not a new entry
    lru.put("d", 4)
    assert dropped == [("b", 2), ("c", 3)] and "a" in lru and lru.get("a") == 10
    assert lru.pop("a") == 10 and lru.pop("a") is None and lru.get("zz") is None
    with pytest.raises(ValueError, match="at least one"):
        LRU(0)


def test_the_operators_table_memory_is_bounded_and_forgets_a_table_that_goes() -> None:
    from datetime import UTC, datetime

    from icefall.controller.status import StatusMemory
    from icefall.plan.applying import Applied

    now = datetime(2026, 1, 1, tzinfo=UTC)
    memory = StatusMemory(max_tables=2)
    for uid in ("a", "b", "c"):
        memory.wrote(uid, now)
        memory.did_apply(uid, ("Lease", "x"), Applied("d", now))
    assert memory.last_write("a") is None and memory.applied("a", ("Lease", "x")) is None  # the oldest went
    assert memory.last_write("c") == now and memory.applied("c", ("Lease", "x")) == Applied("d", now)
    memory.forget("c")
    assert memory.last_write("c") is None and memory.applied("c", ("Lease", "x")) is None
