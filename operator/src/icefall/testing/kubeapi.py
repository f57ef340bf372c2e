"""The Kubernetes API as plain JSON: what the e2e tests use to read Pods, Events and StreamingTables, and to
follow them (`ObjectWatch`) when a state may last less than a poll (a failed pod the operator deletes at
once, a Lease deleted when released)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

Obj = dict[str, Any]


class JsonApi:
    """Plain JSON calls on one ApiClient: no model classes, so objects read exactly as the server sends them.

    Also what the e2e tests use to read Pods, Events and StreamingTables as dicts."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = "application/json",
    ) -> Any:
        """The decoded response; ApiException for any status outside 2xx."""
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=30)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return json.loads(response.data or b"{}")

    def get(self, path: str) -> Obj | None:
        """The object at `path`, or None if there is none (404)."""
        try:
            found: Obj = self.call("GET", path)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found


class ObjectWatch:
    """Every change of the objects at a list path (`/api/v1/namespaces/x/pods`, with a label selector in
    `query`) while it runs: (event type, object as the server sent it), in order.

    A thread lists the path once (each object recorded as LISTED) and follows a watch from that version; a
    dropped connection or the watch's own time-out resumes from the last version seen; 410 Gone lists again
    (each object recorded as LISTED). Use it as a context manager; `events()` is a copy, safe to call while
    it runs.

    Not guaranteed: the intermediate states of an object that changed several times while a 410 made it list
    again (only its state at that list is recorded).
    """

    def __init__(self, api: JsonApi, path: str, query: Sequence[tuple[str, str]] = ()) -> None:
        self.api, self.path, self.query = api, path, list(query)
        self._seen: list[tuple[str, Obj]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._version = self._list()
        self._thread = threading.Thread(target=self._loop, name=f"watch {path}", daemon=True)

    def __enter__(self) -> ObjectWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def events(self) -> list[tuple[str, Obj]]:
        with self._lock:
            return list(self._seen)

    def objects(self) -> list[Obj]:
        """Every state recorded, oldest first (DELETED included: its last state)."""
        return [obj for _, obj in self.events()]

    def _record(self, kind: str, obj: Obj) -> None:
        with self._lock:
            self._seen.append((kind, obj))

    def _list(self) -> str:
        listed: Obj = self.api.call("GET", self.path, query=self.query)
        for item in listed.get("items") or []:
            self._record("LISTED", item)
        return str(listed["metadata"]["resourceVersion"])

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except ApiException as error:
                if error.status == 410:
                    self._version = self._list()
                else:
                    time.sleep(0.5)
            except Exception:  # the connection dropped: watch again from the last version seen
                time.sleep(0.5)

    def _follow(self) -> None:
        query = [*self.query, ("watch", "true"), ("timeoutSeconds", "2"), ("resourceVersion", self._version)]
        request = self.api.api.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.api.call_api(*request, _request_timeout=(5, 30))
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException(http_resp=response)
        raw = response.response
        try:
            for line in iter_resp_lines(raw):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                event: Obj = json.loads(line)
                obj: Obj = event["object"]
                if event["type"] == "ERROR":
                    raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message")))
                self._version = str(obj["metadata"].get("resourceVersion") or self._version)
                if event["type"] != "BOOKMARK":
                    self._record(str(event["type"]), obj)
                if self._stop.is_set():
                    return
        finally:
            raw.close()
            raw.release_conn()
