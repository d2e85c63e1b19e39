from pathlib import Path

import pytest
from pydantic import ValidationError

from bergstream.catalog import CatalogConfig


def test_sqlite_catalog_is_the_same_file_for_spark_and_pyiceberg(tmp_path: Path) -> None:
    catalog = CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "wh")
    assert catalog.uri == f"jdbc:sqlite:{tmp_path}/c.db"
    assert catalog.sqlalchemy_uri() == f"sqlite:///{tmp_path}/c.db"
    conf = catalog.spark_conf()
    assert conf["spark.sql.catalog.bergstream"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.bergstream.type"] == "jdbc"
    assert conf["spark.sql.catalog.bergstream.warehouse"] == (tmp_path / "wh").as_uri()


def test_postgres_catalog_carries_credentials() -> None:
    catalog = CatalogConfig(
        uri="jdbc:postgresql://127.0.0.1:5432/iceberg", warehouse="s3://bucket/wh", user="u", password="p@ss"
    )
    assert catalog.sqlalchemy_uri() == "postgresql+psycopg2://u:p%40ss@127.0.0.1:5432/iceberg"
    conf = catalog.spark_conf()
    assert conf["spark.sql.catalog.bergstream.jdbc.user"] == "u"
    assert conf["spark.sql.catalog.bergstream.jdbc.password"] == "p@ss"
    assert "p@ss" not in repr(catalog)


def test_rest_catalog_passes_properties_through() -> None:
    catalog = CatalogConfig(
        type="rest", uri="http://127.0.0.1:8181", warehouse="wh", properties={"io-impl": "x.Y"}, name="lake"
    )
    conf = catalog.spark_conf()
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.io-impl"] == "x.Y"
    assert catalog.table_identifier("playback") == "lake.archive.playback"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uri": "sqlite:/x.db", "warehouse": "/w"}, "a jdbc catalog needs"),
        ({"type": "rest", "uri": "jdbc:sqlite:/x", "warehouse": "/w"}, "a rest catalog needs"),
        ({"uri": "jdbc:sqlite:/x", "warehouse": "/w", "name": "bad-name"}, "name"),
        ({"uri": "jdbc:sqlite:/x", "warehouse": "/w", "colour": "red"}, "colour"),
        ({"type": "hive", "uri": "thrift://h:9083", "warehouse": "/w"}, "type"),
        ({"uri": "jdbc:sqlite:/x", "warehouse": "warehouse"}, "catalog warehouse 'warehouse' is relative"),
        ({"uri": "jdbc:sqlite:/x", "warehouse": "../w"}, "catalog warehouse '../w' is relative"),
        ({"uri": "jdbc:sqlite:/x", "warehouse": "file:w"}, "catalog warehouse 'file:w' is relative"),
        ({"uri": "jdbc:sqlite:catalog.db", "warehouse": "/w"}, "the SQLite file must be an absolute path"),
    ],
)
def test_bad_catalog_configuration_is_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=message):
        CatalogConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "warehouse", ["/data/w", "file:///data/w", "file:/data/w", "s3://bucket/w", "s3a://bucket"]
)
def test_absolute_warehouses_are_taken(warehouse: str) -> None:
    assert CatalogConfig(uri="jdbc:sqlite:/x.db", warehouse=warehouse).warehouse == warehouse
