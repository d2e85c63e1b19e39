"""The Iceberg catalog: one typed description, seen the same way by Spark and by pyiceberg."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from bergstream.errors import ConfigError
from bergstream.settings_file import OptionValue

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem
    from pyiceberg.catalog import Catalog

CatalogType = Literal["jdbc", "rest"]
# Properties whose values are secrets (s3.secret-access-key, s3.session-token, ...): never shown.
SECRET_PROPERTY = re.compile(r"(?i)secret|password|token|credential")
# PostgreSQL's driver waits without end on a database that stops answering (stalled, not down): a commit,
# and a router's stop behind it, would wait with it. Bounded unless the URI or the properties say otherwise
# (seconds; a commit's statements take milliseconds).
POSTGRESQL_TIMEOUTS = {"connectTimeout": "10", "loginTimeout": "30", "socketTimeout": "60"}
# The FileIO of a warehouse on a local file system.
LOCAL_FILE_IO = "io.bergstream.router.LocalFileIO"
# Iceberg's FileIOs of object stores.
_OBJECT_STORE_FILE_IO = ("S3FileIO", "GCSFileIO", "ADLSFileIO", "OSSFileIO")


class CatalogConfig(BaseModel):
    """Where the archive tables live.

    `jdbc` takes a JDBC URI (`jdbc:sqlite:/path/catalog.db`, `jdbc:postgresql://host:5432/db`); `rest`
    takes the REST catalog's HTTP URI. `properties` pass through to Iceberg under its own names
    (`io-impl`, `s3.endpoint`, `s3.path-style-access`, `s3.access-key-id`, `s3.secret-access-key`,
    `client.region`, ...); pyiceberg gets them translated where its names differ.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="bergstream", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: CatalogType = "jdbc"
    uri: str
    warehouse: str
    namespace: str = Field(default="archive", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    user: str | None = None
    password: SecretStr | None = None
    properties: dict[str, OptionValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _uri_matches_type(self) -> CatalogConfig:
        if self.type == "jdbc" and not self.uri.startswith(("jdbc:sqlite:", "jdbc:postgresql://")):
            raise ValueError(
                f"catalog uri {self.uri!r}: a jdbc catalog needs jdbc:sqlite:<file> or jdbc:postgresql://host/db"
            )
        if self.uri.startswith("jdbc:sqlite:") and not self.uri.removeprefix("jdbc:sqlite:").startswith("/"):
            raise ValueError(f"catalog uri {self.uri!r}: the SQLite file must be an absolute path")
        if self.type == "rest" and not self.uri.startswith(("http://", "https://")):
            raise ValueError(f"catalog uri {self.uri!r}: a rest catalog needs an http:// or https:// URI")
        # A REST catalog's warehouse may be the name the catalog knows it by; a jdbc catalog's is where
        # table files go, the same place whichever folder a router or a backfill starts in.
        if self.type == "jdbc" and not _absolute(self.warehouse):
            raise ValueError(
                f"catalog warehouse {self.warehouse!r} is relative: give an absolute path or a URI such as "
                "file:///data/warehouse or s3://bucket/warehouse"
            )
        return self

    @classmethod
    def sqlite(cls, db_file: Path, warehouse: Path, name: str = "bergstream") -> CatalogConfig:
        return cls(name=name, uri=f"jdbc:sqlite:{db_file}", warehouse=warehouse.as_uri())

    @property
    def object_storage(self) -> bool:
        """Whether the warehouse is in an object store (s3://, gs://, ...) rather than a file system; a REST
        catalog's warehouse may be a name, its files then where its FileIO (S3FileIO, ...) says."""
        if urlparse(self.warehouse).scheme not in ("", "file", "hdfs"):
            return True
        return str(self.properties.get("io-impl", "")).rsplit(".", 1)[-1] in _OBJECT_STORE_FILE_IO

    def table_identifier(self, table: str) -> str:
        """`catalog.namespace.table` for Spark SQL."""
        return f"{self.name}.{self.namespace}.{table}"

    def spark_conf(self) -> dict[str, str]:
        prefix = f"spark.sql.catalog.{self.name}"
        conf = {
            prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.type": self.type,
            f"{prefix}.uri": self.uri,
            f"{prefix}.warehouse": self.warehouse,
            # Routers, maintenance and backfills change the same tables: always read current metadata.
            f"{prefix}.cache-enabled": "false",
        }
        if self.type == "jdbc":
            # V1 catalog tables record whether an entry is a table or a view; pyiceberg reads both.
            conf[f"{prefix}.jdbc.schema-version"] = "V1"
            if self.user is not None:
                conf[f"{prefix}.jdbc.user"] = self.user
            if self.password is not None:
                conf[f"{prefix}.jdbc.password"] = self.password.get_secret_value()
            if self.uri.startswith("jdbc:postgresql:"):
                query = urlparse(self.uri.removeprefix("jdbc:")).query
                for name, seconds in POSTGRESQL_TIMEOUTS.items():
                    if f"{name}=" not in query:
                        conf[f"{prefix}.jdbc.{name}"] = seconds
        local = urlparse(self.warehouse).scheme == "file"
        if self.type == "jdbc" and local and "io-impl" not in self.properties:
            # Hadoop's local file system starts a chmod for every file it makes: the warehouse's files are
            # made by one that does not (LocalFileIO, in router/jvm).
            conf[f"{prefix}.io-impl"] = LOCAL_FILE_IO
        for key, value in self.properties.items():
            conf[f"{prefix}.{key}"] = value
        return conf

    def sqlalchemy_uri(self) -> str:
        """The same JDBC catalog as a SQLAlchemy URI, for pyiceberg's SqlCatalog."""
        if self.uri.startswith("jdbc:sqlite:"):
            return "sqlite:///" + self.uri.removeprefix("jdbc:sqlite:")
        rest = self.uri.removeprefix("jdbc:postgresql://")
        credentials = ""
        if self.user is not None:
            secret = self.password.get_secret_value() if self.password is not None else ""
            credentials = f"{quote(self.user, safe='')}:{quote(secret, safe='')}@"
        return f"postgresql+psycopg2://{credentials}{rest}"

    def check_reachable(self, timeout_seconds: float = 10.0) -> None:
        """Refuse, naming the URI, a REST catalog that does not answer GET /v1/config (a JDBC catalog's
        database is reached by its driver, which names it when it cannot)."""
        if self.type != "rest":
            return
        try:
            urllib.request.urlopen(f"{self.uri.rstrip('/')}/v1/config", timeout=timeout_seconds).close()
        except urllib.error.HTTPError:  # it answers, if only to ask for a login
            return
        except OSError as error:
            reason = getattr(error, "reason", None) or error
            raise ConfigError(
                f"catalog {self.name}: the REST catalog at {self.uri} does not answer ({reason}); start it, "
                "or fix catalog.uri"
            ) from error

    def load(self) -> Catalog:
        """The pyiceberg catalog for this configuration."""
        from pyiceberg.catalog.rest import RestCatalog
        from pyiceberg.catalog.sql import SqlCatalog

        properties = pyiceberg_properties(self.properties)
        if self.type == "rest":
            self.check_reachable()
            return RestCatalog(self.name, uri=self.uri, warehouse=self.warehouse, **properties)
        return SqlCatalog(self.name, uri=self.sqlalchemy_uri(), warehouse=self.warehouse, **properties)

    def filesystem(self) -> FileSystem:
        """pyarrow's file system of the warehouse (S3FileSystem for s3://, else the local one), reached the
        way pyiceberg reaches the table files."""
        from pyiceberg.io.pyarrow import PyArrowFileIO

        location = urlparse(self.warehouse)
        file_io = PyArrowFileIO(pyiceberg_properties(self.properties))
        return file_io.fs_by_scheme(location.scheme or "file", location.netloc or None)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, (redacted(value) if name == "properties" else value)


def pyiceberg_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """Iceberg's catalog properties under pyiceberg's names: it shares `s3.endpoint`, `s3.access-key-id`,
    `s3.secret-access-key` and `client.region` with the Java side, and says path-style access the other
    way round (`s3.force-virtual-addressing`)."""
    translated = dict(properties)
    path_style = translated.get("s3.path-style-access")
    if path_style is not None:
        virtual = path_style.strip().lower() != "true"
        translated.setdefault("s3.force-virtual-addressing", "true" if virtual else "false")
    return translated


def redacted(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties with every secret's value hidden, to show or log."""
    return {key: "*********" if SECRET_PROPERTY.search(key) else value for key, value in properties.items()}


def _absolute(location: str) -> bool:
    """An absolute path, or a URI with an authority (s3://bucket/...) or an absolute path (file:/...)."""
    parsed = urlparse(location)
    if parsed.scheme:
        return bool(parsed.netloc) or parsed.path.startswith("/")
    return location.startswith("/")
