from pathlib import Path

import pytest
from pydantic import ValidationError

from bergstream.catalog import CatalogConfig, pyiceberg_properties, redacted
from bergstream.errors import ConfigError
from bergstream.home import write_catalog
from bergstream.local.processes import free_port
from bergstream.local.rest_catalog import RestCatalogConfig
from bergstream.site import default_catalog


def test_sqlite_catalog_is_the_same_file_for_spark_and_pyiceberg(tmp_path: Path) -> None:
    catalog = CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "wh")
    assert catalog.uri == f"jdbc:sqlite:{tmp_path}/c.db"
    assert catalog.sqlalchemy_uri() == f"sqlite:///{tmp_path}/c.db"
    conf = catalog.spark_conf()
    assert conf["spark.sql.catalog.bergstream"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.bergstream.type"] == "jdbc"
    assert conf["spark.sql.catalog.bergstream.warehouse"] == (tmp_path / "wh").as_uri()
    # A local warehouse's files are made without Hadoop's chmod per file; a FileIO the settings name is kept.
    assert conf["spark.sql.catalog.bergstream.io-impl"] == "io.bergstream.router.LocalFileIO"
    told = CatalogConfig(uri=catalog.uri, warehouse=catalog.warehouse, properties={"io-impl": "x.Y"})
    assert told.spark_conf()["spark.sql.catalog.bergstream.io-impl"] == "x.Y"


def test_postgres_catalog_carries_credentials() -> None:
    catalog = CatalogConfig(
        uri="jdbc:postgresql://127.0.0.1:5432/iceberg", warehouse="s3://bucket/wh", user="u", password="p@ss"
    )
    assert catalog.sqlalchemy_uri() == "postgresql+psycopg2://u:p%40ss@127.0.0.1:5432/iceberg"
    conf = catalog.spark_conf()
    assert conf["spark.sql.catalog.bergstream.jdbc.user"] == "u"
    assert conf["spark.sql.catalog.bergstream.jdbc.password"] == "p@ss"
    assert "p@ss" not in repr(catalog)
    assert "spark.sql.catalog.bergstream.io-impl" not in conf


def test_a_postgres_catalog_s_connections_time_out_unless_told_otherwise() -> None:
    """A database that stops answering fails a commit within a minute (a retried outage) rather than
    holding it, and the router's stop, for ever."""
    conf = CatalogConfig(uri="jdbc:postgresql://127.0.0.1:5432/iceberg", warehouse="/w").spark_conf()
    assert conf["spark.sql.catalog.bergstream.jdbc.socketTimeout"] == "60"
    assert conf["spark.sql.catalog.bergstream.jdbc.loginTimeout"] == "30"
    assert conf["spark.sql.catalog.bergstream.jdbc.connectTimeout"] == "10"
    told = CatalogConfig(
        uri="jdbc:postgresql://127.0.0.1:5432/iceberg?socketTimeout=5", warehouse="/w",
        properties={"jdbc.loginTimeout": 7},
    ).spark_conf()  # fmt: skip
    assert "spark.sql.catalog.bergstream.jdbc.socketTimeout" not in told
    assert told["spark.sql.catalog.bergstream.jdbc.loginTimeout"] == "7"
    sqlite = CatalogConfig(uri="jdbc:sqlite:/x.db", warehouse="/w").spark_conf()
    assert not [key for key in sqlite if "Timeout" in key]


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


S3_PROPERTIES = {
    "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
    "s3.endpoint": "http://127.0.0.1:7070",
    "s3.path-style-access": "true",
    "s3.access-key-id": "bergstream",
    "s3.secret-access-key": "hush-hush",
    "client.region": "us-east-1",
}


def test_s3_properties_reach_spark_as_they_are_and_pyiceberg_in_its_names() -> None:
    catalog = CatalogConfig(
        uri="jdbc:sqlite:/x.db", warehouse="s3://bergstream/warehouse", properties=S3_PROPERTIES
    )
    conf = catalog.spark_conf()
    assert {key.removeprefix("spark.sql.catalog.bergstream."): conf[key] for key in conf if "s3" in key or
            key.endswith(("io-impl", "client.region"))} == S3_PROPERTIES  # fmt: skip
    translated = pyiceberg_properties(S3_PROPERTIES)
    assert translated["s3.force-virtual-addressing"] == "false"
    assert {key: translated[key] for key in S3_PROPERTIES} == S3_PROPERTIES
    assert pyiceberg_properties({"s3.path-style-access": "false"})["s3.force-virtual-addressing"] == "true"
    assert catalog.object_storage
    assert not CatalogConfig(uri="jdbc:sqlite:/x.db", warehouse="file:///w").object_storage


def test_secret_properties_never_show() -> None:
    catalog = CatalogConfig(
        type="rest", uri="http://127.0.0.1:8181", warehouse="s3://b/w", properties=S3_PROPERTIES
    )
    assert "hush-hush" not in repr(catalog) and "hush-hush" not in str(catalog)
    assert "http://127.0.0.1:7070" in repr(catalog)
    assert redacted(S3_PROPERTIES)["s3.secret-access-key"] != "hush-hush"
    assert redacted(S3_PROPERTIES)["s3.access-key-id"] == "bergstream"


def test_the_rest_server_takes_its_settings_as_catalog_variables_and_keys_as_aws_ones(tmp_path: Path) -> None:
    server = RestCatalogConfig(tmp_path, "s3://bergstream/warehouse", port=8282, properties=S3_PROPERTIES)
    environment = server.environment()
    assert environment["CATALOG_URI"] == f"jdbc:sqlite:{tmp_path}/catalog.db"
    assert environment["CATALOG_WAREHOUSE"] == "s3://bergstream/warehouse"
    assert environment["CATALOG_IO__IMPL"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert environment["CATALOG_S3_PATH__STYLE__ACCESS"] == "true"
    assert environment["CATALOG_REST_PORT"] == "8282"
    # The server logs its catalog properties: the keys go where S3FileIO's default credentials find them.
    assert (environment["AWS_ACCESS_KEY_ID"], environment["AWS_SECRET_ACCESS_KEY"]) == (
        "bergstream",
        "hush-hush",
    )
    assert not any("hush-hush" in value for key, value in environment.items() if key.startswith("CATALOG_"))


def test_an_unreachable_rest_catalog_names_its_uri() -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    catalog = CatalogConfig(type="rest", uri=uri, warehouse="s3://b/w")
    with pytest.raises(ConfigError, match=f"the REST catalog at {uri} does not answer"):
        catalog.check_reachable()
    with pytest.raises(ConfigError, match=uri):
        catalog.load()


def test_the_default_catalog_is_the_sites_else_the_one_the_local_stack_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERGSTREAM_SITE", raising=False)
    monkeypatch.setenv("BERGSTREAM_HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match="start the local stack with `bergstream local up`"):
        default_catalog()
    (tmp_path / "home").mkdir()
    local = CatalogConfig.sqlite(tmp_path / "home" / "catalog.db", tmp_path / "home" / "warehouse")
    write_catalog(tmp_path / "home", local)
    assert default_catalog() == local
    site = tmp_path / "site.yaml"
    site.write_text("catalog: {type: rest, uri: http://catalog:8181, warehouse: s3://archive/wh}\n")
    monkeypatch.setenv("BERGSTREAM_SITE", str(site))
    assert default_catalog() == CatalogConfig(
        type="rest", uri="http://catalog:8181", warehouse="s3://archive/wh"
    )


SECRET_SESSION = """
import json, sys
import psutil
from pathlib import Path
from bergstream.catalog import CatalogConfig
from bergstream.spark import build_spark_session

folder = Path(sys.argv[1])
catalog = CatalogConfig(uri=f"jdbc:sqlite:{folder}/c.db", warehouse=(folder / "wh").as_uri(), user="u",
                        password=sys.argv[2])
spark = build_spark_session(catalog, master="local[1]", conf={"spark.ui.enabled": "false"})
spark.sql("CREATE NAMESPACE IF NOT EXISTS bergstream.archive")
loaded = spark._jsparkSession.sessionState().catalogManager().catalog("bergstream").icebergCatalog()
commands = []
for child in psutil.Process().children():
    commands.append(" ".join(child.cmdline()))
print(json.dumps({"password": loaded.properties().get("jdbc.password"), "jvm": commands}))
"""


@pytest.mark.integration
def test_a_catalog_password_reaches_the_catalog_but_not_the_jvms_command_line(tmp_path: Path) -> None:
    """What PySpark hands its JVM at launch is on the command line, which `ps` shows to every user."""
    import json
    import subprocess
    import sys

    secret = "s3cr3t-not-on-the-command-line"
    done = subprocess.run(
        [sys.executable, "-c", SECRET_SESSION, str(tmp_path), secret],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["password"] == secret
    assert seen["jvm"] and any("org.apache.spark" in command for command in seen["jvm"]), seen["jvm"]
    assert not any(secret in command for command in seen["jvm"])


def test_a_setting_may_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bergstream.settings_file import read_mapping

    path = tmp_path / "playback.yaml"
    path.write_text("catalog:\n  password: ${BERGSTREAM_TEST_PASSWORD}\n  uri: jdbc:${BERGSTREAM_TEST_DB}\n")
    monkeypatch.setenv("BERGSTREAM_TEST_PASSWORD", "p@ss ${NOT_EXPANDED_AGAIN}")
    monkeypatch.setenv("BERGSTREAM_TEST_DB", "sqlite:/tmp/c.db")
    assert read_mapping(path)["catalog"] == {
        "password": "p@ss ${NOT_EXPANDED_AGAIN}",
        "uri": "jdbc:sqlite:/tmp/c.db",
    }
    monkeypatch.delenv("BERGSTREAM_TEST_DB")
    with pytest.raises(ConfigError) as refused:
        read_mapping(path)
    assert str(refused.value) == (
        f"{path}: catalog.uri names the environment variable BERGSTREAM_TEST_DB, which is not set; set it, "
        "or write the value"
    )


def test_a_rest_catalogs_warehouse_named_by_the_catalog_is_in_an_object_store_when_its_file_io_is() -> None:
    s3 = CatalogConfig(type="rest", uri="http://polaris:8181/api/catalog", warehouse="archive",
                       properties={"io-impl": "org.apache.iceberg.aws.s3.S3FileIO"})  # fmt: skip
    assert s3.object_storage
    assert not CatalogConfig(type="rest", uri="http://c:8181", warehouse="archive").object_storage
    assert CatalogConfig(type="rest", uri="http://c:8181", warehouse="s3://archive/w").object_storage
