"""Offset resets for a table in a cluster (`icefall.plan.offset_reset` has the design and guarantees).

- `request_reset`: `icefall reset-offsets --namespace N --name X --to earliest|latest` writes the request
  annotation onto the StreamingTable with the caller's kubeconfig (it needs `patch` on streamingtables,
  nothing of the table's credentials); the operator then starts the table's driver again.
- `apply_reset_request`: the driver (`icefall ingest`), before it ingests, applies a request it has not
  applied yet, with `commands.table.reset_table` (the local command's checks and commit), and reports the
  outcome in its log and as an Event on the StreamingTable: `OffsetsReset`, or `OffsetResetRefused` (a
  Warning: nothing to reset, or the request expired).

Not guaranteed: that the Event is sent (a driver that stops right after the commit, or a Role without
`create` on events, only logs it); the reset itself is recorded in the table either way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icefall.plan.driver import EventReason
from icefall.plan.names import ANNOTATION_RESET_OFFSETS
from icefall.plan.offset_reset import FIELD, ResetRequest, ResetRequestError, parse_reset_request

if TYPE_CHECKING:
    from icefall.api import StreamingTable
    from icefall.controller.kube import Kube


def request_reset(args: argparse.Namespace, kube: Kube | None = None) -> int:
    """Write the request onto the StreamingTable `args.namespace/args.name`; exit code 0, or 1 when there
    is no such StreamingTable."""
    from kubernetes.client.exceptions import ApiException

    from icefall.controller.kube import Kube

    if not (args.namespace and args.name) or args.file:
        raise SystemExit(
            "give --namespace and --name of a StreamingTable (a cluster), or -f (local), not both"
        )
    kube = kube or Kube(_api_client())
    try:
        kube.get_streaming_table(args.namespace, args.name)
    except ApiException as error:
        if error.status != 404:
            raise
        raise SystemExit(
            f"icefall: no StreamingTable {args.name!r} in namespace {args.namespace!r}"
        ) from None
    request = ResetRequest(args.to, datetime.now(UTC).replace(microsecond=0))
    kube.patch_annotations(args.namespace, args.name, {ANNOTATION_RESET_OFFSETS: request.to_annotation()})
    print(
        f"[reset] requested {args.to} offsets for StreamingTable {args.namespace}/{args.name} "
        f"({ANNOTATION_RESET_OFFSETS}={request.to_annotation()}): the operator starts its driver again, "
        "which resets the offsets once before it ingests, if the topic was recreated or truncated. See "
        f"`kubectl -n {args.namespace} describe st {args.name}`: Event OffsetsReset, or OffsetResetRefused "
        "and why."
    )
    return 0


def _api_client() -> Any:
    from kubernetes import config as kube_config
    from kubernetes.client import ApiClient

    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]
    return ApiClient()


@dataclass(frozen=True)
class ResetTarget:
    """The table a request resets, in either format: its `icefall.*` properties (None: no table yet) and
    its reset (`to`, the request's id) → whether it reset, and what to say (`commands.table.iceberg_target`,
    `commands.table.delta_target`)."""

    properties: Callable[[], Mapping[str, str] | None]
    reset: Callable[[str, str], tuple[bool, str]]


def apply_reset_request(
    st: StreamingTable,
    target: ResetTarget,
    kube: Kube,
    *,
    now: datetime,
    say: Callable[[str], None] = print,
) -> str | None:
    """Apply the StreamingTable's reset request to `target` (its table) if it has one not applied yet (module
    docstring). The outcome, for the log and tests: None (no request), malformed, expired, done-before,
    reset, refused."""
    from icefall.commit.state import reset_recorded

    try:
        request = parse_reset_request(st.metadata.annotations.get(ANNOTATION_RESET_OFFSETS))
    except ResetRequestError as error:  # the operator holds the driver on it: seen only in a race
        say(f"[reset] {FIELD}: {error}; ignored")
        return "malformed"
    if request is None:
        return None
    if request.expired(now):
        message = (
            f"the offset reset request of {request.id} is older than an hour: ignored, so that it never "
            "resets a topic recreated later; request it again if it is still wanted"
        )
        _report(kube, st, say, EventReason.OFFSET_RESET_REFUSED, message, warning=True)
        return "expired"
    properties = target.properties()
    if properties is not None:
        if reset_recorded(properties, request.id):
            say(f"[reset] the offset reset request of {request.id} was applied already")
            return "done-before"
        done, message = target.reset(request.to, request.id)
    else:
        done, message = False, "nothing to reset: the table does not exist yet"
    reason = EventReason.OFFSETS_RESET if done else EventReason.OFFSET_RESET_REFUSED
    _report(kube, st, say, reason, message.replace("[reset] ", "").replace("\n", "; "), warning=not done)
    return "reset" if done else "refused"


def _report(
    kube: Kube, st: StreamingTable, say: Callable[[str], None], reason: EventReason, message: str, *,
    warning: bool,
) -> None:  # fmt: skip
    from kubernetes.client.exceptions import ApiException

    say(f"[reset] {reason.value}: {message}")
    meta = st.metadata
    try:
        kube.create_event(
            meta.namespace or "default", meta.name, meta.uid or "", reason=reason.value, message=message,
            warning=warning,
        )  # fmt: skip
    except ApiException as error:  # reported in the log; never a reason to stop ingesting
        say(f"[reset] the Event could not be sent ({error.status} {error.reason})")
