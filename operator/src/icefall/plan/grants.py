"""Which Secrets a StreamingTable may reference. Pure: the Secrets' labels are an argument.

A StreamingTable's credential references (`secretKeyRef` in `spec.source.security`, `spec.format.registry`,
`spec.table.catalog.secretProperties`) put a Secret's value into the table's pods, which send it to the
Kafka brokers, schema registry, catalog or OAuth server the table names. Without a rule, anyone who may
create a StreamingTable could send any Secret of the namespace (one they cannot read themselves) to an
endpoint of their choosing. The same holds for a Secret `spec.pods` mounts or sets as a variable
(`icefall.plan.pod_policy.pod_secrets`; the chart's pod policy allows those only when the spec references
them elsewhere or its `podPolicy.secrets` names them): the policy is the cluster admin's word on which
names may be asked for, the label the Secret's owner's consent, and a Secret needs both. So a Secret must
be granted explicitly, by whoever may write Secrets there:

    kubectl -n <namespace> label secret <name> icefall.dev/streamingtables=allow

`secret_refusals` names every reference to a Secret that is missing or not granted, with the field, the
Secret and the fix. The operator then renders no pod for the table (no driver, no compaction, no purge
Job) and reports Ready=False, reason SecretNotAllowed.

Guarantees: only the label is looked at (the operator asks the API for the Secret's metadata, never its
data); a Secret referenced by several fields is named once per field. Not guaranteed: that the key exists
in the Secret (a missing key keeps the pod in CreateContainerConfigError, as Kubernetes reports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from icefall.api import StreamingTableSpec
from icefall.plan.env import credential_references
from icefall.plan.pod_policy import pod_secrets

#: The label (and its value) that grants a Secret to the StreamingTables of its namespace.
SECRET_GRANT_LABEL = "icefall.dev/streamingtables"
SECRET_GRANT_VALUE = "allow"


@dataclass(frozen=True)
class SecretUse:
    """One field of the spec that references key `key` of Secret `secret` ("": a volume of all its keys)."""

    path: str
    secret: str
    key: str


def secret_uses(spec: StreamingTableSpec) -> list[SecretUse]:
    """The spec's `secretKeyRef` references, in spec order (`env` references name no Secret), then the
    Secrets `spec.pods` names (key "" for a volume: all of its keys)."""
    uses = [
        SecretUse(path, ref.secret_key_ref.name, ref.secret_key_ref.key)
        for path, ref in credential_references(spec)
        if ref.secret_key_ref is not None
    ]
    return uses + [SecretUse(path, secret, key) for path, secret, key in pod_secrets(spec)]


def granted(labels: Mapping[str, str] | None) -> bool:
    """A Secret with these labels (None: it does not exist) may be referenced by StreamingTables."""
    return labels is not None and labels.get(SECRET_GRANT_LABEL) == SECRET_GRANT_VALUE


def secret_refusals(
    uses: list[SecretUse], labels: Mapping[str, Mapping[str, str] | None], namespace: str
) -> list[str]:
    """One message per use of a Secret that is missing or not granted; `labels`: each referenced Secret's
    labels by name (None: not found). Empty: every referenced Secret may be used."""
    fix = f"kubectl -n {namespace} label secret {{secret}} {SECRET_GRANT_LABEL}={SECRET_GRANT_VALUE}"
    refusals = []
    for use in uses:
        found = labels.get(use.secret)
        if granted(found):
            continue
        if found is None:
            why = f"Secret {use.secret!r} does not exist in namespace {namespace}"
            then = f"create it, and grant it with `{fix.format(secret=use.secret)}`"
        else:
            why = (
                f"Secret {use.secret!r} is not granted to StreamingTables (its values would go to the "
                f"endpoints the table names)"
            )
            then = f"whoever may write Secrets in {namespace} grants it: `{fix.format(secret=use.secret)}`"
        refusals.append(f"{use.path}: {why}; {then}")
    return refusals
