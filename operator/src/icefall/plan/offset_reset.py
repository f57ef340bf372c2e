"""A request to reset a table's offsets in a cluster: the `icefall.dev/reset-offsets` annotation. Pure.

`icefall reset-offsets` resets a table's committed offsets after its topic was deleted and created again,
or truncated below them (ingestion stops rather than skip or re-read records: TopicRecreated,
OffsetsAheadOfTopic). On a workstation it commits the reset itself. For a table in a cluster, whose
credentials only its pods hold, `icefall reset-offsets --namespace N --name X --to earliest` writes the
request onto the StreamingTable instead:

    icefall.dev/reset-offsets: '{"to": "earliest", "requestedAt": "2026-11-28T10:00:00Z"}'

The operator puts the value in the driver's spec hash (`plan.children.spec_hash`), so a new request
starts a new driver at once (no backoff), and holds the driver with Degraded InvalidSpec while the value
cannot be read. The driver acts on it before it ingests (`commands.reset_request`): the same checks and
the same commit as the local command (`commit.reset_offsets`), which records the request's `requestedAt`
in `icefall.offset-resets` in the metadata commit that moves the offsets.

Guarantees: a request is applied at most once, whatever restarts or races happen: the commit is a
compare-and-swap on `main`, and each attempt first looks for the request in the history it would extend.
A request older (or newer, a skewed clock) than `REQUEST_TTL_SECONDS` is ignored, so a request that found
nothing to reset never resets a topic recreated later. Not guaranteed: the Event that reports the outcome
(sent by the driver) is sent once: a driver that stops between the commit and the Event sends none, and
a request refused (nothing to reset) is reported again by each driver start within the TTL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from icefall.plan.names import ANNOTATION_RESET_OFFSETS

REQUEST_TTL_SECONDS = 3600.0
TARGETS = ("earliest", "latest")
#: Where problems with the request are reported (`plan.children` makes them a Problem of this field).
FIELD = f"metadata.annotations[{ANNOTATION_RESET_OFFSETS}]"
_SHAPE = '{"to": "earliest" or "latest", "requestedAt": "<RFC 3339 time, e.g. 2026-11-28T10:00:00Z>"}'


class ResetRequestError(ValueError):
    """The annotation cannot be read; the message says what is wrong and the expected shape (the field is
    `FIELD`)."""


@dataclass(frozen=True)
class ResetRequest:
    to: str  # earliest | latest
    requested_at: datetime  # timezone-aware

    @property
    def id(self) -> str:
        """What the table's reset history records (the request's time, normalized to UTC)."""
        return self.requested_at.astimezone(UTC).isoformat().replace("+00:00", "Z")

    def to_annotation(self) -> str:
        return json.dumps({"to": self.to, "requestedAt": self.id}, separators=(",", ":"))

    def expired(self, now: datetime) -> bool:
        return abs(now - self.requested_at) > timedelta(seconds=REQUEST_TTL_SECONDS)


def parse_reset_request(text: str | None) -> ResetRequest | None:
    """The request an annotation value holds (None: no annotation); `ResetRequestError` when malformed."""
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or set(data) != {"to", "requestedAt"}:
        raise ResetRequestError(f"not a reset request; write {_SHAPE}, or remove the annotation")
    if data["to"] not in TARGETS:
        raise ResetRequestError(f"to {data['to']!r} is not earliest or latest")
    try:
        when = datetime.fromisoformat(str(data["requestedAt"]).replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ResetRequestError("requestedAt must be an RFC 3339 time with a zone, e.g. 2026-11-28T10:00:00Z")
    return ResetRequest(str(data["to"]), when)


def reset_request_problem(annotations: Mapping[str, str]) -> str | None:
    """Why the StreamingTable's reset request cannot be read, or None (no request, or a readable one)."""
    try:
        parse_reset_request(annotations.get(ANNOTATION_RESET_OFFSETS))
    except ResetRequestError as error:
        return str(error)
    return None
