"""The compaction replica rule.

Proves: no backlog means no pods, whatever the minimum; with a backlog the count is one pod per
`items_per_replica` units rounded up, never below the minimum (nor 1) and never above the maximum; nonsense
inputs are refused.
"""

from __future__ import annotations

import pytest

from icefall.plan.scaling import compaction_replicas

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("backlog", "low", "high", "per", "expected"),
    [
        (0, 0, 5, 1, 0),
        (0, 2, 5, 1, 0),
        (1, 0, 5, 1, 1),
        (3, 0, 5, 1, 3),
        (3, 4, 5, 1, 4),
        (50, 0, 5, 1, 5),
        (7, 0, 10, 3, 3),
        (6, 0, 10, 3, 2),
        (1, 0, 10, 3, 1),
        (9, 0, 0, 1, 0),
    ],
)
def test_replicas_follow_the_backlog(backlog: int, low: int, high: int, per: int, expected: int) -> None:
    assert compaction_replicas(backlog, low, high, items_per_replica=per) == expected


@pytest.mark.parametrize(
    ("backlog", "low", "high", "per"), [(-1, 0, 1, 1), (1, 3, 2, 1), (1, -1, 2, 1), (1, 0, 2, 0)]
)
def test_nonsense_is_refused(backlog: int, low: int, high: int, per: int) -> None:
    with pytest.raises(ValueError):
        compaction_replicas(backlog, low, high, items_per_replica=per)
