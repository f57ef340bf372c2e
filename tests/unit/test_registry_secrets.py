"""The schema registry's basic-auth references reach the registry client the same way on both sides.

Proves: the operator mounts `spec.format.registry.username/password` secretKeyRefs as
`ICEFALL_REGISTRY_USERNAME/PASSWORD` beside the Kafka credentials, the ingestion side reads exactly those
names into `basic.auth.user.info`, an `env` reference is read from the process (icefall run) and is a
problem in a cluster, and a missing variable names the spec field. No registry is contacted.
"""

from __future__ import annotations

import pytest

from icefall.api import StreamingTableSpec, load_manifest
from icefall.kafka.registry import MissingRegistrySecretError, client_config
from icefall.plan.env import secret_env_vars

pytestmark = pytest.mark.unit


def _spec(registry: str) -> StreamingTableSpec:
    return load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "kafka:9092", topic: orders}}
  format: {{type: avro, registry: {registry}}}
  table: {{namespace: it, name: t}}
"""
    ).spec


def test_secret_references_are_mounted_and_read_under_the_same_names() -> None:
    spec = _spec(
        "{url: 'http://r:8081', username: {secretKeyRef: {name: sr, key: user}}, "
        "password: {secretKeyRef: {name: sr, key: pw}}}"
    )
    ingest_env, _, problems = secret_env_vars(spec)
    assert not problems
    assert {env.name: (env.secret, env.key) for env in ingest_env} == {
        "ICEFALL_REGISTRY_USERNAME": ("sr", "user"),
        "ICEFALL_REGISTRY_PASSWORD": ("sr", "pw"),
    }
    environ = {env.name: f"value-of-{env.key}" for env in ingest_env}
    registry = spec.format.registry
    assert registry is not None
    assert client_config(registry, environ) == {
        "url": "http://r:8081",
        "basic.auth.user.info": "value-of-user:value-of-pw",
    }


def test_env_references_work_for_icefall_run_only() -> None:
    spec = _spec("{url: 'http://r:8081', username: {env: SR_USER}, password: {env: SR_PW}}")
    registry = spec.format.registry
    assert registry is not None
    assert client_config(registry, {"SR_USER": "u", "SR_PW": "p"})["basic.auth.user.info"] == "u:p"
    _, _, problems = secret_env_vars(spec)
    assert [p.path for p in problems] == ["spec.format.registry.username", "spec.format.registry.password"]
    with pytest.raises(MissingRegistrySecretError, match=r"spec.format.registry.password: .*SR_PW"):
        client_config(registry, {"SR_USER": "u"})
