"""A mapping with a bound: the least recently used entry goes when a new one would exceed `max_size`.

For every per-table or per-endpoint memory of a long-lived process (the operator's observations and
catalog clients, a driver's schema ids): a tenant can add tables, catalogs and schema ids without limit,
the process's memory must not grow with them. `on_evict(key, value)` lets an owner close what it drops.

Guarantees: at most `max_size` entries; `get` and `put` count as uses. Not thread-safe: the owner locks.
Not guaranteed: that an evicted value is unused (an owner that closes it must tolerate that).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, max_size: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        if max_size < 1:
            raise ValueError(f"an LRU holds at least one entry, got max_size={max_size}")
        self.max_size = max_size
        self._on_evict = on_evict
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            old_key, old_value = self._entries.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._entries))
