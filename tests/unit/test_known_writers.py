"""The writer schemas an ingestion writer has met (`icefall.decode.known_writers`).

Proves: a batch's ids not met before are named, values and keys apart; learning asks for a rewrite only
when a newly met id has a writer schema (an id the registry has none for leaves the batch as decoded: its
records were unknown ids, as they are; it is asked for again in a later batch); a remembered writer schema
keeps its text (the good rows and the dead letters of a batch, decoded at different times, decide its
records alike); a value id is not a key id. Not proved
here: that the writer follows it (tests/integration/test_avro_ingest.py).
"""

from __future__ import annotations

import pytest

from icefall.decode.known_writers import KnownWriters

pytestmark = pytest.mark.unit

V1, V2, KEY = '{"type": "record", "name": "v", "fields": []}', '{"type": "string"}', '"long"'


def test_nothing_met_yet_is_empty_and_every_id_is_unseen() -> None:
    known = KnownWriters()
    assert known.empty
    assert known.unseen([3, 1, 1], [5]) == ([1, 3], [5])


def test_a_new_id_with_a_writer_schema_asks_for_a_rewrite_and_then_is_seen() -> None:
    known = KnownWriters()
    assert known.learn({1: V1})
    assert not known.empty
    assert known.unseen([1, 2]) == ([2], [])
    assert known.learn({2: V2})
    assert known.unseen([1, 2]) == ([], [])
    assert known.of_values([2, 1, 9]) == {1: V1, 2: V2, 9: None}


def test_an_id_the_registry_does_not_know_asks_for_no_rewrite_and_is_asked_again() -> None:
    known = KnownWriters()
    known.learn({1: V1})
    assert not known.learn({66: None})
    assert known.unseen([1, 66]) == ([66], [])  # the next batch with it asks the registry again
    assert known.of_values([66, 1]) == {1: V1, 66: None}
    assert known.learn({66: V2})  # the registry knows it now: the batch is written again with it
    assert known.unseen([1, 66]) == ([], [])


def test_a_first_batch_without_a_known_id_is_still_learnt_from() -> None:
    known = KnownWriters()
    assert not known.learn({13: None})
    assert not known.empty  # later batches learn their ids as they are written, not in a job of their own


def test_a_remembered_writer_schema_keeps_its_text() -> None:
    known = KnownWriters()
    known.learn({7: V1})
    assert not known.learn({7: V2})
    assert known.values[7] == V1


def test_key_ids_are_learnt_apart_from_value_ids() -> None:
    known = KnownWriters()
    assert known.learn({}, {4: KEY})
    assert known.unseen([4], [4]) == ([4], [])
    assert known.learn({4: V1}, {4: KEY})
    assert known.values == {4: V1} and known.keys == {4: KEY}
