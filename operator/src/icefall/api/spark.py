"""`spec.spark`: Spark settings of one table's ingestion session, over the ones Icefall derives.

An allow-list, not a deny-list: a key is accepted only if it is listed in `ALLOWED_KEYS` or starts with one
of `ALLOWED_PREFIXES` — settings that tune how fast and in how much memory a batch runs (shuffle and
adaptive execution, task sizing, memory fractions, timeouts). Everything else is refused with a message
naming the key and the fix, because a deny-list would let through the next setting nobody thought of.
Refused on purpose, among others:
- Icefall's own wiring: `spark.master`, `spark.jars*`, `spark.sql.extensions`, `spark.sql.catalog*`,
  `spark.sql.session.timeZone` (event and produce times are read as UTC), the driver's host and ports,
  Kubernetes settings (`spark.kubernetes.*`), executors and memory (from `spec.pods` resources);
- what would break exactly once: settings that let a read skip data silently
  (`spark.sql.files.ignoreCorruptFiles`, `...ignoreMissingFiles`), speculative tasks, Kafka consumer
  settings (Icefall reads with read_committed and explicit offsets);
- anything that looks like a credential (password, secret, token, ...): Secrets are referenced, never
  inline.

Guaranteed: what this model accepts reaches the table's session last (it wins over Icefall's derived
values, such as `spark.sql.shuffle.partitions`). Not guaranteed: that an accepted value is a good one,
except `spark.network.timeout`, refused under 60 s (a shorter one stops the driver at start).
"""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from icefall.api.base import ApiModel, Loc, ProblemCollector, looks_secret

#: Keys accepted as they are.
ALLOWED_KEYS = frozenset(
    {
        "spark.sql.shuffle.partitions",
        "spark.default.parallelism",
        "spark.sql.autoBroadcastJoinThreshold",
        "spark.sql.files.maxPartitionBytes",
        "spark.sql.files.openCostInBytes",
        "spark.sql.files.maxRecordsPerFile",
        "spark.sql.execution.arrow.maxRecordsPerBatch",
        "spark.memory.fraction",
        "spark.memory.storageFraction",
        "spark.locality.wait",
        "spark.network.timeout",
        "spark.task.maxFailures",
    }
)
#: Families of keys accepted (each prefix ends with a dot).
ALLOWED_PREFIXES = ("spark.sql.adaptive.", "spark.sql.codegen.", "spark.memory.offHeap.")
#: Why a key that is not allowed is Icefall's, with the fix: the first matching prefix wins.
REFUSED_BECAUSE = (
    ("spark.master", "the master comes from the icefall.dev/spark-master annotation (or --master)"),
    ("spark.jars", "Icefall's jars come from its image or ICEFALL_SPARK_JARS"),
    ("spark.sql.extensions", "Icefall needs Iceberg's SQL extensions"),
    ("spark.sql.catalog", "the catalog comes from spec.table.catalog"),
    ("spark.sql.session.timeZone", "Icefall reads event and produce times as UTC"),
    ("spark.sql.files.ignore", "a read that skips files silently would break exactly once"),
    ("spark.speculation", "speculative tasks are not supported by Icefall's writes"),
    ("spark.kafka.", "Icefall reads Kafka with read_committed at explicit offsets; see spec.source"),
    ("spark.kubernetes.", "pod settings come from spec.pods and the operator's settings"),
    ("spark.executor.", "executor cores and memory come from spec.pods.executor.resources"),
    ("spark.driver.", "driver memory and addresses come from spec.pods.driver and the operator"),
    ("spark.dynamicAllocation.", "executor counts are the operator's settings"),
    ("spark.app.name", "the application name identifies the table's pods"),
    ("spark.scheduler.", "Icefall schedules ingestion and maintenance itself"),
)
MAX_SETTINGS = 64
ALLOWED = ", ".join([*sorted(ALLOWED_KEYS), *(f"{p}*" for p in ALLOWED_PREFIXES)])


def is_allowed(key: str) -> bool:
    return key in ALLOWED_KEYS or key.startswith(ALLOWED_PREFIXES)


#: Spark's `spark.network.timeoutInterval` (60 s, not a table's to change): a driver whose
#: `spark.network.timeout` is shorter fails at start ("timeoutInterval should be less than or equal to").
MIN_NETWORK_TIMEOUT_SECONDS = 60
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_SECONDS_PER = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def _network_timeout_problem(value: str) -> str | None:
    """Why `spark.network.timeout` = `value` would stop the driver, if it would (Spark's time string:
    a number, seconds unless a unit follows)."""
    match = _DURATION.match(value)
    if match is None:
        return f"not a duration Spark reads (e.g. 120s, 5min); {value!r}"
    seconds = int(match.group(1)) * _SECONDS_PER[(match.group(2) or "s").lower()]
    if seconds < MIN_NETWORK_TIMEOUT_SECONDS:
        return (
            f"at least {MIN_NETWORK_TIMEOUT_SECONDS}s (Spark's heartbeat check interval; a shorter timeout "
            f"stops the driver at start); set {MIN_NETWORK_TIMEOUT_SECONDS}s or more"
        )
    return None


def spark_conf_problems(conf: dict[str, str]) -> list[tuple[Loc, str]]:
    """One problem per key of `conf` that `spec.spark.conf` may not set (module docstring)."""
    problems: list[tuple[Loc, str]] = []
    for key in sorted(conf):
        loc: Loc = ("conf", key)
        if looks_secret(key):
            problems.append(
                (loc, "credentials are not Spark settings of a table; reference a Secret in spec.source "
                      "or spec.table.catalog and remove this key")
            )  # fmt: skip
        elif not is_allowed(key):
            reason = next((why for prefix, why in REFUSED_BECAUSE if key.startswith(prefix)), None)
            if reason is not None:
                problems.append((loc, f"not a setting a table may change: {reason}; remove it"))
            else:
                problems.append((loc, f"not a setting a table may change; remove it (allowed: {ALLOWED})"))
        elif key == "spark.network.timeout" and (why := _network_timeout_problem(conf[key])) is not None:
            problems.append((loc, why))
    return problems


class SparkSpec(ApiModel):
    """Spark settings of this table's ingestion session (see `spark.conf`)."""

    conf: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_SETTINGS,
        description=(
            "Spark configuration of this table's ingestion session, over what Icefall derives (e.g. "
            "spark.sql.shuffle.partitions: twice the executors' cores). Only settings that tune speed and "
            f"memory are accepted: {ALLOWED}. Icefall's own wiring (master, jars, "
            "extensions, catalogs, time zone, Kubernetes, executors, Kafka) and anything that could skip "
            "data or carries a credential is refused."
        ),
    )

    @model_validator(mode="after")
    def _allowed(self) -> SparkSpec:
        problems = ProblemCollector()
        problems.extend((), spark_conf_problems(self.conf))
        problems.raise_if_any()
        return self
