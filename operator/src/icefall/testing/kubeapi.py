"""The Kubernetes API as plain JSON: what the e2e tests use to read Pods, Events and StreamingTables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

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
