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
        (0, 2, 5, 1, 2),  # minReplicas: that many pods even with nothing to do
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


def test_scale_down_waits_for_the_cool_down_and_scale_up_does_not() -> None:
    from icefall.plan.scaling import damped_replicas

    assert damped_replicas(3, None, None, 0.0, cooldown_seconds=60) == 3  # first decision
    assert damped_replicas(4, 1, 100.0, 101.0, cooldown_seconds=60) == 4  # up at once
    assert damped_replicas(0, 2, 100.0, 159.0, cooldown_seconds=60) == 2  # down: not yet
    assert damped_replicas(0, 2, 100.0, 160.0, cooldown_seconds=60) == 0  # down after the cool-down
    with pytest.raises(ValueError, match="cooldown_seconds"):
        damped_replicas(0, 1, 0.0, 0.0, cooldown_seconds=-1)
