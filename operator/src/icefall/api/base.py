"""Shared building blocks of the API models: the base model, secret references and problem reporting.

Guarantees:
- Every spec model is immutable, rejects unknown fields, and is written in YAML with camelCase names
  (Python code may use the snake_case attribute names; manifests loaded by `load_manifest` may not,
  because the Kubernetes API server would prune them).
- A secret is never accepted inline: `SecretRef` holds either a `secretKeyRef` or an `env` name, and the
  error for an inline value never repeats the value.
- Cross-field checks report each problem with its own path, through `ProblemCollector`.

Not guaranteed here: that a referenced Secret or environment variable exists — that is checked by whoever
resolves the reference (the operator or the local runner), at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Patterns shared by several models. `PATTERN_HINTS` turns a mismatch into an instruction.
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NAMESPACE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
PROPERTY_KEY_PATTERN = r"^[A-Za-z0-9._-]+$"
TOPIC_PATTERN = r"^[A-Za-z0-9._-]+$"
BOOTSTRAP_PATTERN = r"^[^,\s]+:[0-9]{1,5}(,[^,\s]+:[0-9]{1,5})*$"
FIELD_NAME_PATTERN = r"^[^.`]+$"
FIELD_PATH_PATTERN = r"^[^.`]+(\.[^.`]+)*$"
#: A Kubernetes quantity without a sign (`500m`, `2`, `1.5`, `4Gi`, `1e3`).
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"  # the number, then a binary or decimal suffix or an exponent
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: A qualified name (`cpu`, `nvidia.com/gpu`, `app.kubernetes.io/name`): optional DNS prefix and a name.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MOUNT_PATH_PATTERN = r"^/.*$"

PATTERN_HINTS: dict[str, str] = {
    IDENTIFIER_PATTERN: "use letters, digits and '_', starting with a letter or '_'",
    NAMESPACE_PATTERN: "use letters, digits and '_', starting with a letter or '_'; '.' separates levels",
    DNS1123_LABEL_PATTERN: "use lowercase letters, digits and '-'; start and end with a letter or digit",
    DNS1123_SUBDOMAIN_PATTERN: "use lowercase letters, digits, '-' and '.' (a Kubernetes object name)",
    SECRET_KEY_PATTERN: "use letters, digits, '-', '_' and '.' (a key of the Secret's data)",
    ENV_NAME_PATTERN: "use letters, digits and '_', starting with a letter or '_'",
    PROPERTY_KEY_PATTERN: "use letters, digits, '.', '_' and '-'",
    TOPIC_PATTERN: "a Kafka topic name uses letters, digits, '.', '_' and '-'",
    BOOTSTRAP_PATTERN: "write host:port, comma-separated for several brokers (kafka-0:9092,kafka-1:9092)",
    FIELD_NAME_PATTERN: "a field name cannot contain '.' or a backtick",
    FIELD_PATH_PATTERN: "name a column, with '.' between struct levels (e.g. shipping.city)",
    QUANTITY_PATTERN: "write a Kubernetes quantity such as 500m, 2, 1.5, 512Mi or 4Gi",
    QUALIFIED_NAME_PATTERN: "write [dns.prefix/]name with letters, digits, '-', '_' and '.'",
    LABEL_VALUE_PATTERN: "a label value uses letters, digits, '-', '_' and '.', at most 63 characters",
    MOUNT_PATH_PATTERN: "write an absolute path, starting with /",
}

#: Words that mark a configuration key as secret; such keys must be given as references.
SECRET_KEY_WORDS = (
    *("password", "secret", "token", "credential", "jaas", "private"),
    *("account-key", "account.key"),  # Azure storage's shared key (adls.account-key, Java's ...account.key)
)

Loc = tuple[str | int, ...]

PROBLEMS_ERROR_TYPE = "icefall_problems"


class ApiModel(BaseModel):
    """Base of every spec model: camelCase in YAML, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
        use_enum_values=False,
    )


class StatusModel(BaseModel):
    """Base of status models: like `ApiModel`, but unknown fields are ignored.

    Status is written by the operator; a rolled-back operator must still read the status a newer one wrote.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
    )


def format_loc(loc: Sequence[str | int]) -> str:
    """`("spec", "table", "partitioning", 0, "transform")` → `spec.table.partitioning[0].transform`."""
    out = ""
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif item and all(c.isalnum() or c in "_-" for c in item):
            out += f".{item}" if out else item
        else:
            out += f"[{item!r}]"
    return out


class ProblemCollector:
    """Collects cross-field problems, each with a path relative to the model being validated.

    `raise_if_any()` raises one pydantic error of type `icefall_problems` that carries every problem;
    `icefall.api.manifest` expands it into one line per problem with the full dotted path.
    """

    def __init__(self) -> None:
        self.problems: list[tuple[Loc, str]] = []

    def add(self, loc: Loc, message: str) -> None:
        self.problems.append((loc, message))

    def extend(self, prefix: Loc, problems: Sequence[tuple[Loc, str]]) -> None:
        for loc, message in problems:
            self.problems.append(((*prefix, *loc), message))

    def raise_if_any(self) -> None:
        if not self.problems:
            return
        summary = "; ".join(f"{format_loc(loc) or '(here)'}: {msg}" for loc, msg in self.problems)
        raise PydanticCustomError(
            PROBLEMS_ERROR_TYPE,
            "{summary}",
            {"summary": summary, "problems": tuple(self.problems)},
        )


def looks_secret(key: str) -> bool:
    """True when a configuration key names a secret (password, token, JAAS config, ...)."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


INLINE_SECRET_MESSAGE = (
    "inline secret values are not allowed; reference the value instead: "
    "{secretKeyRef: {name: <secret>, key: <key>}} or {env: <VARIABLE>}"
)


class SecretKeySelector(ApiModel):
    """Selects one key of a Kubernetes Secret in the StreamingTable's namespace."""

    name: str = Field(
        description="Name of the Secret, in the same namespace as the StreamingTable.",
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
    )
    key: str = Field(
        description="Key within the Secret's data.",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
    )


class SecretRef(ApiModel):
    """Where a secret value comes from: exactly one of `secretKeyRef` or `env`.

    `secretKeyRef` is resolved by the operator and mounted into the pods it runs; `env` names an
    environment variable of the process that runs the pipeline (handy for `icefall run`).
    """

    secret_key_ref: SecretKeySelector | None = Field(
        default=None, description="A key of a Kubernetes Secret holding the value."
    )
    env: str | None = Field(
        default=None,
        description="Name of an environment variable holding the value.",
        min_length=1,
        max_length=256,
        pattern=ENV_NAME_PATTERN,
    )

    @model_validator(mode="before")
    @classmethod
    def _reject_inline(cls, data: Any) -> Any:
        if not isinstance(data, dict) and not isinstance(data, SecretRef):
            # The message never includes the value: it may be a password.
            raise PydanticCustomError("inline_secret", "{message}", {"message": INLINE_SECRET_MESSAGE})
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.secret_key_ref is None) == (self.env is None):
            problems = ProblemCollector()
            problems.add((), "set exactly one of secretKeyRef or env")
            problems.raise_if_any()
        return self


#: Longest metadata.name: leaves room for child names such as `icefall-<name>-commit` within 63 characters.
MAX_NAME_LENGTH = 40


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata Icefall reads; everything else is ignored."""

    model_config = StatusModel.model_config  # the same: unknown metadata is ignored

    name: str = Field(
        description="Name of the StreamingTable.",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=DNS1123_LABEL_PATTERN,
    )
    namespace: str | None = Field(
        default=None, description="Kubernetes namespace.", max_length=63, pattern=DNS1123_LABEL_PATTERN
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    generation: int | None = Field(default=None, ge=0, description="Spec generation, set by the API server.")
    uid: str | None = Field(default=None, description="Object UID, set by the API server.")
