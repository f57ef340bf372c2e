"""The one mapping from `spec.table.catalog` to the two clients: pyiceberg and Spark's Iceberg runtime.

`CatalogConfig.for_table(spec)` reads `spec.table.catalog` (or, when it is absent, makes the embedded
default in a state folder) and resolves `secretProperties` from this process's environment: an `env`
reference reads that variable, a `secretKeyRef` reads the variable the operator gives its pods
(`ICEFALL_CATALOG_<KEY>`, named by `icefall.plan.env.secret_env_vars`). The config then gives:

- sql, `sqlite:///path`: pyiceberg `SqlCatalog` on `sqlite:////abs/path`; Spark `JdbcCatalog` on
  `jdbc:sqlite:/abs/path` with a busy timeout (SQLite has one writer at a time).
- sql, `postgresql://[user@]host[:port]/db[?…]`: pyiceberg `SqlCatalog` on
  `postgresql+psycopg2://user:password@host/db`; Spark `JdbcCatalog` on `jdbc:postgresql://host/db` with
  `jdbc.user` and `jdbc.password`. The user comes from the URI or a `user` (`jdbc.user`) property, the
  password from `secretProperties.password` (or `jdbc.password`).
- rest, `http(s)://…`: pyiceberg `RestCatalog`; Spark `type=rest`. Both get `uri` and `warehouse`.
- sql `warehouse`: a local path becomes a `file:` URI; any other location (`s3://…`) is kept.
- every other property passes through to both sides under its own name (`prefix`, `credential`, `token`,
  `scope`, `oauth2-server-uri`, `header.*`, `s3.endpoint`, `s3.region`, `s3.access-key-id`, …): Iceberg's
  Python and Java catalogs and FileIOs use the same names. `s3.path-style-access` also sets pyiceberg's
  `s3.force-virtual-addressing` to its negation.
- object storage (an `s3://`/`s3a://` warehouse or any `s3.*` property): without `s3.region` (or
  `client.region`) both sides use us-east-1 (pyiceberg would otherwise ask AWS for the bucket's region,
  and the AWS SDK insists on one). Spark only: `io-impl` S3FileIO unless set, `client.region` from
  `s3.region`, and with `s3.endpoint` and no `s3.path-style-access`, path-style access (pyarrow's default
  addressing, so both sides address the store alike).
- Azure storage (an `abfs(s)://`/`wasb(s)://` warehouse or any `adls.*` property; icefall.catalog.azure):
  pyiceberg gets `py-io-impl` AzureFileIO unless set (pyiceberg 0.12's own FileIO misreads these locations);
  Spark gets `io-impl` ADLSFileIO and the Java names of the key and endpoint, derived from pyiceberg's
  `adls.account-name`, `adls.account-key` and `adls.dfs-storage-authority`/`-scheme`, unless set.
- Google Cloud Storage (a `gs://` warehouse or any `gcs.*` property): Spark only, `io-impl` GCSFileIO unless
  set. `gcs.service.host` (an emulator's or private endpoint), `gcs.project-id`, `gcs.no-auth` and
  `gcs.oauth2.token` pass through to both sides. Without a token both clients use Google's default
  credential chain: on GKE that is Workload Identity, so no key is stored anywhere. `gcs.no-auth=true` (an
  emulator) also gives pyiceberg a placeholder token, since its pyarrow GcsFileSystem has no anonymous
  switch: a token is sent and the emulator ignores it. pyiceberg's FileIO is `icefall.catalog.gcs_io.
  GcsFileIO` unless `py-io-impl` is set: GCS calls fail after seconds, not the client's 15 minutes.
- a sql catalog on a local (`file:`) warehouse: pyiceberg gets `py-io-impl` FsspecFileIO unless set, whose
  local files need no pyarrow (pyarrow's FileIO costs `icefall run` ~85 MiB of RSS for metadata it reads
  and writes as well; bench/results/memory.md).
- always, Spark: `cache-enabled=false`, since pyiceberg moves refs behind Spark's back.

No property names code: keys such as `py-io-impl`, `io-impl`, `*-impl`, `*.class` or `client.factory`
(`icefall.api.code_properties`) are refused in `properties` and `secretProperties` with the field and the
reason; the FileIOs above are Icefall's fixed choices, and the pyiceberg clients are
`icefall.catalog.confined`'s, which drop such keys from what a REST catalog or a table's metadata says
(Spark sessions reach a REST catalog through `icefall.catalog.rest_proxy`, which does the same for Spark).

Guarantees: secret values never appear in `repr()` or in the messages of the errors raised here, and
`mask(text)` removes them from any other text (a client's exception); a missing secret raises
`MissingCredentialError` naming the spec field and the variable; a REST catalog that refuses the
credentials when the client opens it raises `CatalogCredentialsRefusedError` (icefall.catalog.refusal).
Not guaranteed: that the catalog is reachable or that the credentials work (that shows when a client is
used). For a sql catalog the database's tables are created by pyiceberg first (its "V0" layout, which
Iceberg's JdbcCatalog reads and writes as is), so call `pyiceberg()` before building a Spark session.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from icefall.api import CatalogType, StreamingTableSpec
from icefall.api.code_properties import code_property_problem
from icefall.catalog.azure import PY_AZURE_FILE_IO, is_azure_location, java_properties
from icefall.plan.env import secret_env_vars

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
#: A Delta table's session only (`icefall.spark.session.delta_conf`): Spark's session catalog wrapped by
#: Delta's, through which Delta tables are read and maintained (Iceberg's are named catalogs).
DELTA_SESSION_CATALOG = {"spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}
JDBC_CATALOG = "org.apache.iceberg.jdbc.JdbcCatalog"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
GCS_FILE_IO = "org.apache.iceberg.gcp.gcs.GCSFileIO"
PY_GCS_FILE_IO = "icefall.catalog.gcs_io.GcsFileIO"  # pyiceberg's PyArrowFileIO, GCS retries bounded
#: pyiceberg's FileIO for a local (`file:`) warehouse: fsspec's, which reads and writes metadata without
#: importing pyarrow's datasets, Parquet and compute (~85 MiB RSS in `icefall run`, bench/results/memory.md).
PY_LOCAL_FILE_IO = "pyiceberg.io.fsspec.FsspecFileIO"
PY_ARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"  # pyiceberg's default for other locations
#: Every FileIO class pyiceberg may load in an Icefall process (`icefall.catalog.confined`).
PY_FILE_IOS = (PY_LOCAL_FILE_IO, PY_ARROW_FILE_IO, PY_AZURE_FILE_IO, PY_GCS_FILE_IO)
# pyiceberg's stand-in for `gcs.no-auth` (see the module doc): a token an emulator ignores, valid until 2100.
GCS_NO_AUTH_TOKEN = "icefall-no-auth"
GCS_NO_AUTH_EXPIRES_MS = "4102444800000"
DEFAULT_S3_REGION = "us-east-1"  # when the spec names none (see the module doc)
SQLITE_BUSY_TIMEOUT_MS = "30000"  # SQLite allows one writer at a time: wait for the lock, do not fail
POSTGRES_DRIVER = "psycopg2"  # SQLAlchemy's driver for postgresql:// (pyiceberg[sql-postgres])
MASK = "***"
SECRET_PATH = "spec.table.catalog.secretProperties[{key}]"

# Keys the adapter derives from the spec's own fields (or always sets); in `properties` they would
# contradict those fields, so they are refused with the field to use instead.
_DERIVED = {
    "type": "spec.table.catalog.type",
    "uri": "spec.table.catalog.uri",
    "warehouse": "spec.table.catalog.warehouse",
    "catalog-impl": "spec.table.catalog.type",
    "py-catalog-impl": "spec.table.catalog.type",
    "cache-enabled": "nothing (Icefall always turns Spark's catalog cache off)",
}
_USER_KEYS = ("user", "jdbc.user")
_PASSWORD_KEYS = ("password", "jdbc.password")
_S3_SCHEMES = ("s3://", "s3a://", "s3n://")
_GCS_SCHEMES = ("gs://",)


class CatalogConfigError(ValueError):
    """`spec.table.catalog` cannot be turned into catalog clients; the message names the field."""


class MissingCredentialError(CatalogConfigError):
    """A secret property's variable is not set in this process (names the field and the variable)."""


@dataclass(frozen=True)
class _Database:
    """A sql catalog's database, parsed from its URI (no password: the API refuses one in the URI)."""

    dialect: str  # sqlite | postgresql
    path: Path | None = None  # sqlite: the database file, absolute
    driver: str = ""  # postgresql: the SQLAlchemy driver
    user: str = ""
    address: str = ""  # postgresql: host[:port]
    database: str = ""
    query: str = ""

    @classmethod
    def parse(cls, uri: str) -> _Database:
        raw = uri.removeprefix("jdbc:")
        scheme, _, rest = raw.partition(":")
        dialect, _, driver = scheme.lower().partition("+")
        if dialect == "sqlite":
            # SQLAlchemy: sqlite:///relative.db, sqlite:////absolute.db; JDBC: jdbc:sqlite:<path>
            path = rest[3:] if rest.startswith("///") else rest if uri.startswith("jdbc:") else ""
            if not path or path.startswith(":memory:"):
                raise CatalogConfigError(
                    f"spec.table.catalog.uri: {uri!r} names no database file; use sqlite:////path/catalog.db"
                )
            return cls("sqlite", path=Path(path.split("?", 1)[0]).resolve())
        if dialect in ("postgresql", "postgres"):
            parts = urlsplit(f"postgresql:{rest}")
            user, _, address = parts.netloc.rpartition("@")
            if ":" in user:
                raise CatalogConfigError(
                    "spec.table.catalog.uri: the URI carries a password; reference it in "
                    "secretProperties.password"
                )
            if not address:
                raise CatalogConfigError(f"spec.table.catalog.uri: {uri!r} names no host")
            return cls(
                "postgresql",
                driver=driver or POSTGRES_DRIVER,
                user=user,
                address=address,
                database=parts.path.lstrip("/"),
                query=parts.query,
            )
        raise CatalogConfigError(
            f"spec.table.catalog.uri: {scheme} catalogs are not supported (Icefall's image carries the "
            "SQLite and PostgreSQL drivers); use sqlite:, postgresql: or a rest catalog"
        )

    def sqlalchemy_url(self, user: str, password: str) -> str:
        if self.path is not None:
            return f"sqlite:///{self.path}"
        login = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
        url = f"postgresql+{self.driver}://{login + '@' if login else ''}{self.address}/{self.database}"
        return url + (f"?{self.query}" if self.query else "")

    def jdbc_url(self) -> str:
        if self.path is not None:
            return f"jdbc:sqlite:{self.path}"
        return f"jdbc:postgresql://{self.address}/{self.database}" + (f"?{self.query}" if self.query else "")


@dataclass(frozen=True)
class CatalogConfig:
    """One Iceberg catalog, as both pyiceberg and Spark open it. Build with `for_table` or `embedded`.

    `properties` are the non-secret catalog properties, `secrets` the resolved secret ones (masked in
    `repr`); both by catalog property name.
    """

    name: str
    type: CatalogType
    uri: str
    warehouse: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for key, where in _DERIVED.items():
            for kind, given in (("properties", self.properties), ("secretProperties", self.secrets)):
                if key in given:
                    raise CatalogConfigError(f"spec.table.catalog.{kind}[{key}]: set {where} instead")
        for kind, given in (("properties", self.properties), ("secretProperties", self.secrets)):
            for key, value in sorted(given.items()):
                if (problem := code_property_problem(key, value)) is not None:
                    raise CatalogConfigError(f"spec.table.catalog.{kind}[{key}]: {problem}")
        if self.type is CatalogType.SQL:
            _Database.parse(self.uri)  # fail early, naming the field

    # -- construction -------------------------------------------------------------------------------------

    @classmethod
    def embedded(cls, state_dir: Path, name: str = "icefall") -> CatalogConfig:
        """The embedded default: a SQLite catalog and a warehouse folder inside `state_dir`."""
        return cls.sqlite(state_dir / "catalog.db", state_dir / "warehouse", name=name)

    @classmethod
    def sqlite(cls, database: Path, warehouse: Path, name: str = "icefall") -> CatalogConfig:
        """A SQLite catalog in `database` with table files under the local folder `warehouse`."""
        return cls(
            name=name,
            type=CatalogType.SQL,
            uri=f"sqlite:///{database.resolve()}",
            warehouse=warehouse.resolve().as_uri(),
        )

    @classmethod
    def for_table(
        cls,
        spec: StreamingTableSpec,
        *,
        state_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> CatalogConfig:
        """The catalog of `spec.table.catalog`, secrets resolved from `environ` (default: this process's
        environment); without one, the embedded default in `state_dir` (required then)."""
        catalog = spec.table.catalog
        if catalog is None:
            if state_dir is None:
                raise CatalogConfigError("spec.table.catalog is not set (no embedded catalog here)")
            return cls.embedded(state_dir)
        uri, warehouse = catalog.uri, catalog.warehouse
        if catalog.type is CatalogType.SQL:
            database = _Database.parse(uri).path
            if database is not None:  # relative paths are relative to here, once and for all
                uri = f"sqlite:///{database}"
            if warehouse and "://" not in warehouse:
                warehouse = Path(warehouse.removeprefix("file:")).resolve().as_uri()  # a local folder
        return cls(
            name=catalog.name,
            type=catalog.type,
            uri=uri,
            warehouse=warehouse,
            properties=dict(catalog.properties),
            secrets=_resolve_secrets(spec, os.environ if environ is None else environ),
        )

    # -- the two clients ----------------------------------------------------------------------------------

    def pyiceberg(self, *, make_folders: bool = True, request_timeout: float | None = None) -> Catalog:
        """A new pyiceberg client (`SqlCatalog` or `RestCatalog`, confined to Icefall's code:
        `icefall.catalog.confined`). For SQLite, creates the database's folder
        and a local warehouse folder first, unless `make_folders` is False (a reader only: a catalog whose
        folder is missing is an error there, not something to create). `request_timeout`: bound every
        connection and request of the client to that many seconds (`icefall.catalog.timeouts`; the driver's
        table meter); None: pyiceberg's defaults."""
        from icefall.catalog.confined import confine_pyiceberg, rest_catalog, sql_catalog

        confine_pyiceberg(PY_FILE_IOS)
        props = self.pyiceberg_properties()
        if request_timeout is not None:
            props = _bounded(props, request_timeout)
        if self.type is CatalogType.REST:
            from icefall.catalog.refusal import CatalogCredentialsRefusedError, refusal

            try:
                # fetches a token and /v1/config: refusals show here
                return rest_catalog(self.name, props, request_timeout=request_timeout)
            except Exception as error:
                refused = refusal(error)
                if refused is None:
                    raise
                raise CatalogCredentialsRefusedError.of(self, refused) from None
        database = _Database.parse(self.uri)
        if make_folders and database.path is not None:
            database.path.parent.mkdir(parents=True, exist_ok=True)
        if make_folders and self.warehouse and self.warehouse.startswith("file:"):
            Path(urlsplit(self.warehouse).path).mkdir(parents=True, exist_ok=True)
        return sql_catalog(self.name, props)

    def pyiceberg_properties(self) -> dict[str, str]:
        """The properties `pyiceberg()` opens the catalog with (secret values included: never log them)."""
        props = {**self.properties, **self.secrets}
        props["type"] = self.type.value
        if self.type is CatalogType.SQL:
            user, password = _pop_first(props, _USER_KEYS), _pop_first(props, _PASSWORD_KEYS)
            database = _Database.parse(self.uri)
            props["uri"] = database.sqlalchemy_url(user or database.user, password)
        else:
            props["uri"] = self.uri
        if self.warehouse:
            props["warehouse"] = self.warehouse
        if self.uses_s3 and "s3.region" not in props and "client.region" not in props:
            props["s3.region"] = DEFAULT_S3_REGION
        path_style = props.get("s3.path-style-access")
        if path_style is not None and "s3.force-virtual-addressing" not in props:
            props["s3.force-virtual-addressing"] = "false" if path_style.lower() == "true" else "true"
        if self.uses_azure:
            props.setdefault("py-io-impl", PY_AZURE_FILE_IO)
        if props.get("gcs.no-auth", "").lower() == "true" and "gcs.oauth2.token" not in props:
            props["gcs.oauth2.token"] = GCS_NO_AUTH_TOKEN
            props["gcs.oauth2.token-expires-at"] = GCS_NO_AUTH_EXPIRES_MS
        if self.uses_gcs:
            props.setdefault("py-io-impl", PY_GCS_FILE_IO)
        if self.local_warehouse:
            props.setdefault("py-io-impl", PY_LOCAL_FILE_IO)
        return props

    def spark_conf(self) -> dict[str, str]:
        """`spark.sql.catalog.<name>` and its options (secret values included: never log them)."""
        props = {**self.properties, **self.secrets}
        options: dict[str, str] = {}
        if self.type is CatalogType.SQL:
            database = _Database.parse(self.uri)
            user, password = _pop_first(props, _USER_KEYS), _pop_first(props, _PASSWORD_KEYS)
            options["catalog-impl"] = JDBC_CATALOG
            options["uri"] = database.jdbc_url()
            if user or database.user:
                options["jdbc.user"] = user or database.user
            if password:
                options["jdbc.password"] = password
            if database.path is not None:
                options["jdbc.busy_timeout"] = SQLITE_BUSY_TIMEOUT_MS
        else:
            options["type"] = "rest"
            options["uri"] = self.uri
        if self.warehouse:
            options["warehouse"] = self.warehouse
        options.update(props)
        if self.uses_s3:
            options.setdefault("io-impl", S3_FILE_IO)
            options.setdefault("client.region", props.get("s3.region", DEFAULT_S3_REGION))
            if "s3.endpoint" in props:
                options.setdefault("s3.path-style-access", "true")
        if self.uses_azure:
            for key, value in java_properties(props, self.warehouse).items():
                options.setdefault(key, value)
        if self.uses_gcs:
            options.setdefault("io-impl", GCS_FILE_IO)
        # pyiceberg moves refs (staging branches, main) behind Spark's back: never serve cached metadata.
        options["cache-enabled"] = "false"
        prefix = self.spark_prefix
        return {prefix: SPARK_CATALOG, **{f"{prefix}.{key}": value for key, value in options.items()}}

    @property
    def spark_prefix(self) -> str:
        """`spark.sql.catalog.<name>`: this catalog's key in Spark's conf (its options follow a dot)."""
        return f"spark.sql.catalog.{self.name}"

    # -- facts and safety ---------------------------------------------------------------------------------

    @property
    def uses_s3(self) -> bool:
        """Table files live in S3 or an S3-compatible store (an s3 warehouse or s3.* properties)."""
        keys = [*self.properties, *self.secrets]
        return bool(self.warehouse and self.warehouse.startswith(_S3_SCHEMES)) or any(
            key.startswith("s3.") for key in keys
        )

    @property
    def uses_azure(self) -> bool:
        """Table files live in Azure storage (an abfs(s)/wasb(s) warehouse or adls.* properties)."""
        keys = [*self.properties, *self.secrets]
        return is_azure_location(self.warehouse) or any(key.startswith("adls.") for key in keys)

    @property
    def local_warehouse(self) -> bool:
        """A sql catalog whose table files live in a local (`file:`) warehouse and in no object store."""
        return (
            self.type is CatalogType.SQL
            and bool(self.warehouse and self.warehouse.startswith("file:"))
            and not (self.uses_s3 or self.uses_azure or self.uses_gcs)
        )

    @property
    def uses_gcs(self) -> bool:
        """Table files live in Google Cloud Storage (a gs:// warehouse or gcs.* properties)."""
        keys = [*self.properties, *self.secrets]
        return bool(self.warehouse and self.warehouse.startswith(_GCS_SCHEMES)) or any(
            key.startswith("gcs.") for key in keys
        )

    @property
    def database(self) -> Path:
        """The SQLite database file (a SQLite catalog only)."""
        path = _Database.parse(self.uri).path if self.type is CatalogType.SQL else None
        if path is None:
            raise ValueError(f"catalog {self.name!r} is not a SQLite catalog")
        return path

    def mask(self, text: str) -> str:
        """`text` with every secret value (also URL-quoted, as in a database URL) replaced by ***."""
        values = {v for value in self.secrets.values() if value for v in (value, quote(value, safe=""))}
        for value in sorted(values, key=len, reverse=True):
            text = text.replace(value, MASK)
        return text

    def key(self) -> str:
        """A digest of the whole configuration, secrets included: equal configs, equal keys."""
        fields = [self.name, self.type.value, self.uri, self.warehouse, self.properties, self.secrets]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        secrets = {key: MASK for key in sorted(self.secrets)}
        return (
            f"CatalogConfig(name={self.name!r}, type={self.type.value!r}, uri={self.uri!r}, "
            f"warehouse={self.warehouse!r}, properties={dict(self.properties)!r}, secrets={secrets!r})"
        )


def _bounded(props: dict[str, str], seconds: float) -> dict[str, str]:
    from icefall.catalog.timeouts import bounded_postgres_url, bounded_properties

    bounded = bounded_properties(props, seconds)
    if bounded["uri"].startswith("postgresql"):
        bounded["uri"] = bounded_postgres_url(bounded["uri"], seconds)
    return bounded


def _pop_first(props: dict[str, str], keys: tuple[str, ...]) -> str:
    found = ""
    for key in keys:
        value = props.pop(key, "")
        found = found or value
    return found


def _resolve_secrets(spec: StreamingTableSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """`spec.table.catalog.secretProperties`, each read from its variable (see the module doc)."""
    catalog = spec.table.catalog
    assert catalog is not None
    pod_variables = {env.path: env for env in secret_env_vars(spec)[1]}
    values: dict[str, str] = {}
    for key, ref in sorted(catalog.secret_properties.items()):
        path = SECRET_PATH.format(key=key)
        if ref.env is not None:
            name, hint = ref.env, f"set it or change {path}.env"
        else:
            env = pod_variables[path]
            name = env.name
            hint = (
                f"the operator fills it from key {env.key!r} of Secret {env.secret!r} in the pods it runs; "
                "elsewhere set it yourself, or reference the value with {env: NAME}"
            )
        value = environ.get(name)
        if not value:
            state = "is not set" if value is None else "is empty"
            raise MissingCredentialError(f"{path}: environment variable {name} {state} ({hint})")
        values[key] = value
    return values
