"""One catalog configuration, two clients: pyiceberg (`SqlCatalog`) and Spark (`JdbcCatalog`).

Both sides must use the same catalog name and the same database, or each sees only its own tables.
The SQLite file's tables are created by pyiceberg first (its "V0" layout, which Iceberg's JdbcCatalog
reads and writes as is), so `pyiceberg()` is called before a Spark session is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog


@dataclass(frozen=True)
class CatalogConfig:
    name: str
    database: Path
    warehouse: Path

    @classmethod
    def embedded(cls, state_dir: Path, name: str = "icefall") -> CatalogConfig:
        """The embedded default: a SQLite catalog and a warehouse folder inside `state_dir`."""
        return cls(name=name, database=state_dir / "catalog.db", warehouse=state_dir / "warehouse")

    def pyiceberg(self) -> SqlCatalog:
        from pyiceberg.catalog.sql import SqlCatalog

        self.database.parent.mkdir(parents=True, exist_ok=True)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        return SqlCatalog(
            self.name,
            uri=f"sqlite:///{self.database.resolve()}",
            warehouse=self.warehouse.resolve().as_uri(),
        )

    def spark_conf(self) -> dict[str, str]:
        prefix = f"spark.sql.catalog.{self.name}"
        return {
            prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            f"{prefix}.uri": f"jdbc:sqlite:{self.database.resolve()}",
            f"{prefix}.warehouse": self.warehouse.resolve().as_uri(),
            # pyiceberg moves refs (staging branches, main) behind Spark's back: never serve cached metadata.
            f"{prefix}.cache-enabled": "false",
            # SQLite allows one writer at a time; wait for the lock rather than fail at once.
            f"{prefix}.jdbc.busy_timeout": "30000",
        }
