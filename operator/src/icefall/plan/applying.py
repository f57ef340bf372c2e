"""Which children a pass applies: those whose rendering changed since this process last applied them, and
every one of them now and then. Pure: the caller keeps the record and the clock.

A resync that force-applied every child of every table every 30 s cost ~16 API requests per table per
minute for nothing: the rendering had not changed. Now an unchanged child is applied again only after
`repair_seconds` (10 min by default), which repairs an edit made behind the operator's back; a child
deleted behind its back comes back at once (the operator watches its children's deletion and forgets the
record, `icefall.controller.handlers`). A new process (a restart, a new leader) has no record and applies
everything once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from icefall.plan.names import digest

#: How long an unchanged child goes without being applied again.
REPAIR_SECONDS = 600.0
#: The digest of a child that must not exist (deleted, not applied).
ABSENT = "absent"

#: A child of a table: (kind, name).
ChildKey = tuple[str, str]


@dataclass(frozen=True)
class Applied:
    """What this process last did to one child: the digest it applied (or `ABSENT`), and when."""

    digest: str
    at: datetime


def child_key(manifest: Mapping[str, Any]) -> ChildKey:
    return str(manifest["kind"]), str(manifest["metadata"]["name"])


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    return digest(json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str))


def due(last: Applied | None, wanted: str, now: datetime, repair_seconds: float = REPAIR_SECONDS) -> bool:
    """Whether to apply (or delete) a child whose wanted digest is `wanted`, given what was `last` done."""
    if last is None or last.digest != wanted:
        return True
    return (now - last.at).total_seconds() >= repair_seconds
