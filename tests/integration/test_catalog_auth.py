"""Authenticated REST catalogs, end to end: Iceberg's REST server (on PostgreSQL, files in MinIO) behind
`CatalogAuthProxy`, an OAuth2 front that checks client credentials and bearer tokens.

Proves: `icefall run` with the OAuth2 `credential` by reference creates the table and commits through
Spark's Iceberg REST client and pyiceberg alike; a run longer than the tokens' lifetime keeps committing
(exactly once), the clients refreshing their tokens; a static bearer `token` by reference works, and
neither it nor the storage keys is ever on the command line of `icefall run` or of Spark's JVM (they are
set on the running session: the catalog, created on first use, still authenticates with them); a wrong
client secret or token ends `icefall run` with one line naming the catalog, the refusal and the fields to
fix (no traceback, no secret, no waiting as for an outage), and, as a driver's last words, with
`CatalogCredentialsRefused: <that line>`, which the operator's status makes Ingesting/Ready False and
Degraded True with that reason and the fields (not CatalogUnavailable); with no storage keys in the spec,
storage credentials vended with each table (`X-Iceberg-Access-Delegation: vended-credentials`) are enough
for Spark and pyiceberg. Does not prove: SigV4 signing, or vending of scoped short-lived keys by a real
cloud catalog (the front vends the store's own keys).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from icefall.api import ConditionReason, ConditionStatus, ConditionType, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.catalog_auth import CatalogAuthProxy
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.testing.driver_exit import conditions_after_exit, run_as_driver
from icefall.testing.plugin import REST_CLIENT_ID, REST_CLIENT_SECRET
from icefall.testing.streams import assert_exactly_once, manifest_text, produce, shared_catalog, watermarks

pytestmark = pytest.mark.integration

CREDENTIAL = f"{REST_CLIENT_ID}:{REST_CLIENT_SECRET}"


def icefall(*args: str, env: Mapping[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefall.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def rest_block(
    request: pytest.FixtureRequest, uri: str, secret_key: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The shared `rest-s3` catalog block pointed at `uri`, authenticating with `secret_key` (`credential`
    or `token`) read from IT_REST_SECRET; its environment without that variable."""
    shared = shared_catalog(request, "rest-s3")
    block = dict(shared.block)
    secrets = {k: v for k, v in block["secretProperties"].items() if k != "credential"}
    properties = {**block["properties"], "oauth2-server-uri": f"{uri}/v1/oauth/tokens"}
    block.update(
        uri=uri, properties=properties, secretProperties={**secrets, secret_key: {"env": "IT_REST_SECRET"}}
    )
    return block, {k: v for k, v in shared.env.items() if k != "IT_REST_CREDENTIAL"}


@pytest.mark.parametrize(
    ("secret_key", "value"),
    [("credential", f"{REST_CLIENT_ID}:wrong-secret"), ("token", "not-a-token-it-issued")],
    ids=["wrong-client-secret", "wrong-token"],
)
def test_refused_credentials_end_icefall_run_with_one_line(  # noqa: PLR0917 (fixtures)
    kafka: KafkaBroker,
    rest_catalog_auth: CatalogAuthProxy,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    secret_key: str,
    value: str,
) -> None:
    topic = f"it-auth-refused-{secret_key}"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 10)
    block, env = rest_block(request, rest_catalog_auth.uri, secret_key)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(f"auth_refused_{secret_key}", topic, kafka.bootstrap, catalog=block))
    termination_log = tmp_path / "termination-log"
    started = time.monotonic()
    run = run_as_driver(
        ["run", "-f", str(manifest), "--state-dir", str(tmp_path / "state"), "--until-caught-up"],
        {**env, "IT_REST_SECRET": value}, termination_log, timeout=300,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert value not in output
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("icefall: catalog 'icefall' at " + rest_catalog_auth.uri), last
    assert "refused the credentials" in last, last
    field = f"spec.table.catalog.secretProperties[{secret_key}]"
    assert field in last, last
    assert elapsed < 120, f"a refusal is not an outage to wait out ({elapsed:.0f} s)"
    print(f"icefall run ended in {elapsed:.1f} s: {last}")
    # In a pod, the same line is the container's termination message, after the reason.
    last_words = termination_log.read_text()
    assert last_words.strip() == "CatalogCredentialsRefused: " + last.removeprefix("icefall: "), last_words

    # The driver's last words reach the table's conditions (the operator reads no catalog itself): the
    # refusal and the field, not an outage.
    st = load_manifest(manifest.read_text())
    refused = ConditionReason.CATALOG_CREDENTIALS_REFUSED
    conditions = conditions_after_exit(st, exit_code=run.returncode, last_words=last_words)
    false, true = ConditionStatus.FALSE, ConditionStatus.TRUE
    assert conditions[ConditionType.INGESTING][:2] == (false, refused), conditions
    assert conditions[ConditionType.DEGRADED][:2] == (true, refused), conditions
    assert conditions[ConditionType.READY][:2] == (false, refused), conditions
    message = conditions[ConditionType.INGESTING][2]
    assert "refused the credentials" in message and field in message, message
    assert not [c for c in conditions.values() if value in c[2]]


def test_a_run_longer_than_the_token_lifetime_keeps_committing(
    kafka: KafkaBroker, rest_catalog_s3: RESTCatalogServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Tokens live 8 s; the run commits three waves ~10 s apart: both clients must renew their tokens
    (Iceberg Java by token exchange before expiry, pyiceberg by a new client-credentials grant after a 401)
    and lose nothing."""
    proxy = CatalogAuthProxy(rest_catalog_s3.uri, {REST_CLIENT_ID: REST_CLIENT_SECRET}, token_ttl=8).start()
    topic, name = "it-auth-refresh", "auth_refresh"
    kafka.create_topic(topic, partitions=2)
    block, env = rest_block(request, proxy.uri, "credential")
    env = {**env, "IT_REST_SECRET": CREDENTIAL}
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block))
    config = CatalogConfig.for_table(load_manifest(manifest.read_text()).spec, environ=env)
    log = tmp_path / "run.log"
    proc: subprocess.Popen[bytes] | None = None
    commits: list[float] = []
    try:
        bad = produce(kafka, topic, 0, 100, bad_every=25)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "icefall.cli", "run", "-f", str(manifest),
                 "--state-dir", str(tmp_path / "state"), "--no-maintenance"],
                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        catalog = config.pyiceberg()
        for wave in range(1, 4):
            high = watermarks(kafka, topic)
            deadline = time.monotonic() + (240 if wave == 1 else 60)
            while True:
                assert proc.poll() is None, log.read_text()[-4000:]
                table = ("it", name)
                if catalog.table_exists(table) and read_committed(catalog.load_table(table)).offsets == high:
                    break
                assert time.monotonic() < deadline, f"wave {wave} not committed: {log.read_text()[-4000:]}"
                time.sleep(0.5)
            commits.append(time.monotonic())
            if wave < 3:
                time.sleep(10)  # longer than a token lives
                bad |= produce(kafka, topic, 100 * wave, 100, bad_every=25)
        stats = dict(proxy.stats)
        print(
            f"commits at +{[round(t - commits[0]) for t in commits]} s; token endpoint and refusals: {stats}"
        )
        # Iceberg Java (Spark) renews by token exchange before expiry; pyiceberg gets a 401, then a new grant.
        assert stats.get("issued.token_exchange", 0) > 0, stats
        assert stats.get("issued.client_credentials", 0) > 2, stats
        assert stats.get("refused.client", 0) == 0, stats
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
        assert_exactly_once(config, name, high, bad, bootstrap=kafka.bootstrap)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        proxy.stop()


def process_tree(root: int) -> dict[int, str]:
    """The command lines of process `root` and of its descendants (parents from /proc/<pid>/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    tree, grown = {root}, True
    while grown:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grown = bool(found)
    lines: dict[int, str] = {}
    for pid in tree:
        try:
            lines[pid] = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return lines


def run_watching_command_lines(
    args: list[str], env: Mapping[str, str], log: Path, timeout: float = 600
) -> tuple[int, set[str]]:
    """Run `icefall <args>` to its end; its exit code and every command line seen in its process tree
    (sampled every 0.1 s: Spark's JVM lives for the whole run)."""
    seen: set[str] = set()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "icefall.cli", *args],
            env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                seen |= set(process_tree(proc.pid).values())
                time.sleep(0.1)
            return proc.wait(timeout=1), seen
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_static_bearer_token_by_reference_is_accepted(
    kafka: KafkaBroker, rest_catalog_s3: RESTCatalogServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    token = "it-static-token-0123456789"
    proxy = CatalogAuthProxy(rest_catalog_s3.uri, {}, static_tokens=(token,)).start()
    try:
        topic, name = "it-auth-token", "auth_token"
        kafka.create_topic(topic, partitions=1)
        bad = produce(kafka, topic, 0, 50, bad_every=10)
        block, env = rest_block(request, proxy.uri, "token")
        env = {**env, "IT_REST_SECRET": token}
        manifest = tmp_path / "table.yaml"
        manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block))
        log = tmp_path / "run.log"
        code, command_lines = run_watching_command_lines(
            ["run", "-f", str(manifest), "--state-dir", str(tmp_path / "state"), "--until-caught-up",
             "--no-maintenance"], env, log,
        )  # fmt: skip
        output = log.read_text()
        assert code == 0, output[-4000:]
        assert token not in output
        # The catalog authenticated with the token (the proxy refuses requests without it), yet neither it
        # nor the storage key was ever on a command line of the run: Python's, spark-submit's, the JVM's.
        assert any("org.apache.spark.deploy.SparkSubmit" in line for line in command_lines), command_lines
        for secret in (token, env["IT_S3_SECRET_KEY"]):
            leaked = [line for line in command_lines if secret in line]
            assert not leaked, f"a secret on a command line: {leaked[0].replace(secret, '<secret>')[:3000]}"
        config = CatalogConfig.for_table(load_manifest(manifest.read_text()).spec, environ=env)
        assert_exactly_once(config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)
        assert not any(key.startswith("refused.") for key in proxy.stats), dict(proxy.stats)
    finally:
        proxy.stop()


def test_vended_storage_credentials_replace_static_keys(
    kafka: KafkaBroker, rest_catalog_s3: RESTCatalogServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """No s3 keys in the spec: the catalog hands them out with each table (`X-Iceberg-Access-Delegation:
    vended-credentials`), and Spark's S3FileIO and pyiceberg write and read the table with them."""
    store = request.getfixturevalue("object_store").properties()
    keys = {key: store[key] for key in ("s3.access-key-id", "s3.secret-access-key")}
    proxy = CatalogAuthProxy(rest_catalog_s3.uri, {REST_CLIENT_ID: REST_CLIENT_SECRET}, vended=keys).start()
    try:
        topic, name = "it-auth-vended", "auth_vended"
        kafka.create_topic(topic, partitions=1)
        bad = produce(kafka, topic, 0, 50, bad_every=10)
        block, env = rest_block(request, proxy.uri, "credential")
        block["secretProperties"] = {"credential": {"env": "IT_REST_SECRET"}}  # no storage keys at all
        block["properties"] = {
            **block["properties"],
            "header.X-Iceberg-Access-Delegation": "vended-credentials",
        }
        env = {"IT_REST_SECRET": CREDENTIAL}
        manifest = tmp_path / "table.yaml"
        manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=block))
        run = icefall(
            "run", "-f", str(manifest), "--state-dir", str(tmp_path / "state"), "--until-caught-up",
            "--no-maintenance", env=env,
        )  # fmt: skip
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-4000:]
        assert keys["s3.secret-access-key"] not in output
        config = CatalogConfig.for_table(load_manifest(manifest.read_text()).spec, environ=env)
        assert not any(key.startswith("s3.") for key in config.secrets)
        assert_exactly_once(config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)
        assert proxy.stats["vended"] > 0, dict(proxy.stats)
        print(f"vended: {dict(proxy.stats)}")
    finally:
        proxy.stop()
