"""Pipelining decisions (`icefall.plan.pipelining`) on a fake clock: what a step does with the batch it wrote.

Proves: a batch is pipelined only when pipelining is on, it has no bad records, and a next batch at least as
large is waiting that the pacing starts at once (behind: after `min_interval`; caught up: once the batch
took long enough that the caught-up interval has passed); a batch over a commit that was re-staged is
discarded and one over a refused commit is dropped, whatever else holds; a batch over a commit that
landed is decided as if nothing had been in flight; a batch that met a writer schema it was not decoded
with is written again (REWRITE) once nothing below can make it be discarded or dropped. The module
imports only the standard library, `api` and `plan`. Not proved here: that the engine follows the
decision (tests/integration/test_pipelining.py, test_schema_evolution.py for REWRITE).
"""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import pytest

from icefall.plan import pipelining
from icefall.plan.pipelining import Action, Below, Pace, Written, after_write, next_is_due

pytestmark = pytest.mark.unit

STARTED = 1_000.0  # the fake clock's reading when the step started
BEHIND = Pace(pipelined=True, freshness_target_seconds=10, min_interval_seconds=0, throughput_rps=100)
FAST = Pace(pipelined=True, freshness_target_seconds=10, min_interval_seconds=0, throughput_rps=1e6)


def written(records: int = 1_000, backlog: int = 5_000, bad: int = 0) -> Written:
    return Written(records=records, backlog=backlog, bad=bad, started=STARTED)


def test_behind_with_a_large_backlog_a_clean_batch_is_pipelined() -> None:
    # 4,000 records left at 100 records/s: 40 s > F/2, behind; no minimum interval: due at once.
    assert next_is_due(written(), BEHIND, now=STARTED + 1)
    assert after_write(Below.NONE, written(), BEHIND, now=STARTED + 1) is Action.PIPELINE


def test_a_batch_with_bad_records_is_committed_here_with_its_dead_letters() -> None:
    assert after_write(Below.NONE, written(bad=1), BEHIND, now=STARTED + 1) is Action.COMMIT


def test_pipelining_off_commits_here() -> None:
    off = Pace(pipelined=False, freshness_target_seconds=10, min_interval_seconds=0, throughput_rps=100)
    assert after_write(Below.NONE, written(), off, now=STARTED + 1) is Action.COMMIT


def test_less_left_than_the_batch_waits_for_the_commit_to_take_more() -> None:
    assert not next_is_due(written(records=1_000, backlog=1_999), BEHIND, now=STARTED + 1)
    assert next_is_due(written(records=1_000, backlog=2_000), BEHIND, now=STARTED + 1)
    # A batch that reads nothing (it pins a start or skips a retention gap) needs one record waiting.
    assert not next_is_due(written(records=0, backlog=0), BEHIND, now=STARTED + 1)
    assert next_is_due(written(records=0, backlog=1_000), BEHIND, now=STARTED + 1)


def test_behind_the_minimum_interval_holds_the_next_batch_back() -> None:
    paced = Pace(pipelined=True, freshness_target_seconds=10, min_interval_seconds=5, throughput_rps=100)
    assert after_write(Below.NONE, written(), paced, now=STARTED + 2) is Action.COMMIT
    assert after_write(Below.NONE, written(), paced, now=STARTED + 5) is Action.PIPELINE


def test_unknown_throughput_counts_as_behind() -> None:
    unknown = Pace(pipelined=True, freshness_target_seconds=10, min_interval_seconds=0, throughput_rps=None)
    assert after_write(Below.NONE, written(), unknown, now=STARTED) is Action.PIPELINE


def test_caught_up_a_quick_batch_waits_and_a_slow_one_is_pipelined() -> None:
    # Left: 4,000 records at 1e6 records/s, caught up. After a batch of d seconds the next one starts
    # min(F/2, F - 2d) seconds after this one did: due at once only when d >= F/3.
    assert after_write(Below.NONE, written(), FAST, now=STARTED + 1) is Action.COMMIT  # in 5 s: 4 s away
    assert after_write(Below.NONE, written(), FAST, now=STARTED + 3) is Action.COMMIT  # in 4 s: 1 s away
    assert after_write(Below.NONE, written(), FAST, now=STARTED + 3.5) is Action.PIPELINE  # in 3 s: passed


def test_over_a_re_staged_commit_the_batch_is_discarded_and_over_a_refused_one_dropped() -> None:
    for facts, pace in itertools.product((written(), written(bad=3), written(backlog=1)), (BEHIND, FAST)):
        assert after_write(Below.RESTAGED, facts, pace, now=STARTED + 1) is Action.DISCARD
        assert after_write(Below.REFUSED, facts, pace, now=STARTED + 1) is Action.DROP


def test_over_a_landed_commit_the_batch_is_decided_as_if_nothing_was_in_flight() -> None:
    clock = (STARTED, STARTED + 1, STARTED + 4, STARTED + 60)
    for facts, pace, now in itertools.product(
        (written(), written(bad=3), written(backlog=1)), (BEHIND, FAST), clock
    ):
        assert after_write(Below.LANDED, facts, pace, now=now) is after_write(
            Below.NONE, facts, pace, now=now
        )


def test_only_a_clean_batch_with_pipelining_on_is_ever_pipelined() -> None:
    paces = [
        Pace(pipelined=on, freshness_target_seconds=10, min_interval_seconds=m, throughput_rps=t)
        for on, m, t in itertools.product((True, False), (0, 5), (None, 100, 1e6))
    ]
    facts = [
        written(r, b, bad) for r, b, bad in itertools.product((0, 1_000), (0, 999, 2_000, 10**6), (0, 1))
    ]
    for below, pace, fact, now in itertools.product(Below, paces, facts, (STARTED, STARTED + 10)):
        action = after_write(below, fact, pace, now=now)
        if action is Action.PIPELINE:
            assert pace.pipelined and not fact.bad and below in (Below.NONE, Below.LANDED)


def test_the_module_imports_only_the_standard_library_api_and_plan() -> None:
    tree = ast.parse(Path(pipelining.__file__).read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    allowed = ("icefall.api", "icefall.plan")
    outside = {
        name
        for name in imported
        if name.split(".")[0] not in sys.stdlib_module_names
        and name != "__future__"
        and not name.startswith(allowed)
    }
    assert not outside, outside


@pytest.mark.parametrize("below", [Below.NONE, Below.LANDED])
def test_a_batch_that_met_a_new_writer_schema_is_written_again_whatever_the_pace(below: Below) -> None:
    unseen = Written(records=1_000, backlog=5_000, bad=3, started=STARTED, unseen_writers=True)
    for pace in (BEHIND, FAST, Pace(False, 10, 0, None)):
        assert after_write(below, unseen, pace, now=STARTED + 1) is Action.REWRITE


def test_a_batch_that_met_a_new_writer_schema_over_a_restaged_or_refused_commit_is_not_written_again() -> (
    None
):
    unseen = Written(records=1_000, backlog=5_000, bad=3, started=STARTED, unseen_writers=True)
    assert after_write(Below.RESTAGED, unseen, BEHIND, now=STARTED + 1) is Action.DISCARD
    assert after_write(Below.REFUSED, unseen, BEHIND, now=STARTED + 1) is Action.DROP
