"""The operator's JSON log lines (`controller.logs`): one object per line with time, level, logger, message,
and the object kopf's per-object records refer to."""

from __future__ import annotations

import json
import logging

import pytest

from icefall.controller.logs import JsonFormatter

pytestmark = pytest.mark.unit


def test_a_record_becomes_one_json_object_naming_the_object() -> None:
    record = logging.LogRecord(
        "kopf.objects", logging.WARNING, __file__, 1, "Handler %r failed", ("x",), None
    )
    record.k8s_ref = {"namespace": "shop", "name": "orders", "uid": "u"}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert {k: data[k] for k in ("level", "logger", "message", "namespace", "name")} == {
        "level": "warning",
        "logger": "kopf.objects",
        "message": "Handler 'x' failed",
        "namespace": "shop",
        "name": "orders",
    }
    assert data["time"].endswith("+00:00")
