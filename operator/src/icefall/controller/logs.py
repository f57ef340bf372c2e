"""The operator's log format: text for people, or one JSON object per line for log pipelines.

JSON lines carry `time` (RFC 3339, UTC), `level`, `logger`, `message`, and `exception` when there is one;
kopf's per-object records add `namespace` and `name` (from its `k8s_ref`). No secret reaches a log line
from here: specs hold only references to secrets, the operator opens no client to a table's endpoints, and
the errors it reports are masked where they are turned into messages (`controller.deletion`).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            line.update({k: ref[k] for k in ("namespace", "name") if ref.get(k)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str, *, json_lines: bool = False) -> None:
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
