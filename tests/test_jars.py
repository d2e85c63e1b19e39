from pathlib import Path

import pyspark
import pytest

from bergstream import jars, maven
from bergstream.errors import BergstreamError, MissingToolError
from bergstream.jars import spark_home_jars


def test_pyspark_is_the_pinned_spark_version() -> None:
    assert pyspark.__version__ == jars.pinned_versions().spark


def test_iceberg_runtime_is_built_for_the_pinned_spark_minor() -> None:
    versions = jars.pinned_versions()
    spark_minor = ".".join(versions.spark.split(".")[:2])
    names = {jar.name for jar in jars.resolved_jars("spark")}
    expected = f"iceberg-spark-runtime-{spark_minor}_{versions.scala_binary}-{versions.iceberg}.jar"
    assert expected in names


@pytest.mark.parametrize(
    ("artifact", "shipped"),
    [("zstd-jni", True), ("zstd", False), ("kafka-clients", False), ("scala-library", True)],
)
def test_ships_matches_whole_artifact_names(tmp_path: Path, artifact: str, shipped: bool) -> None:
    for name in (
        "zstd-jni-1.5.6-10.jar",
        "log4j-1.2-api-2.24.3.jar",
        "kafka-clients-extra-1.0.jar",
        "scala-library-2.13.16.jar",
    ):
        (tmp_path / name).touch()
    assert jars.ships(tmp_path, artifact) is shipped


def test_spark_jars_leave_out_what_spark_ships() -> None:
    handed = {jars.artifact_id(jar) for jar in jars.spark_jars(spark_home_jars())}
    assert {"spark-sql-kafka-0-10_2.13", "spark-avro_2.13", "sqlite-jdbc", "postgresql"} <= handed
    assert not {"scala-library", "slf4j-api", "hadoop-client-api"} & handed


def test_resolve_is_idempotent_and_offline_once_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    first = jars.resolve("kafka")
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn: a cached set must not need it
    assert jars.resolve("kafka") == first


def test_missing_maven_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BERGSTREAM_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingToolError, match="'mvn' was not found"):
        jars.resolve("spark")


def test_list_settings_are_extended_not_replaced(tmp_path: Path) -> None:
    from bergstream.catalog import CatalogConfig
    from bergstream.spark import session_conf

    catalog = CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "wh")
    conf = session_conf(
        catalog,
        conf={
            "spark.jars": "/opt/extra.jar",
            "spark.executor.extraJavaOptions": "-Dx=1",
            "spark.ui.port": "4050",
        },
    )
    jars_handed = conf["spark.jars"].split(",")
    assert jars_handed[-1] == "/opt/extra.jar" and any("iceberg-spark-runtime" in jar for jar in jars_handed)
    assert conf["spark.executor.extraJavaOptions"].endswith("-Dx=1")
    assert "org.apache.avro.limits.string.maxLength" in conf["spark.executor.extraJavaOptions"]
    assert conf["spark.ui.port"] == "4050"


@pytest.mark.parametrize(
    ("master", "partitions"),
    [("local", "1"), ("local[2]", "2"), ("local[3,2]", "3"), ("spark://127.0.0.1:7077", "200")],
)
def test_shuffle_partitions_follow_the_local_cores(master: str, partitions: str, tmp_path: Path) -> None:
    from bergstream.catalog import CatalogConfig
    from bergstream.spark import session_conf

    catalog = CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "wh")
    assert session_conf(catalog, master)["spark.sql.shuffle.partitions"] == partitions
    overridden = session_conf(catalog, master, conf={"spark.sql.shuffle.partitions": "16"})
    assert overridden["spark.sql.shuffle.partitions"] == "16"


def test_bergstreams_java_is_built_once_and_the_backfill_and_hybrid_sources_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import zipfile

    jar = jars.project_jar()
    assert jar in jars.spark_jars()
    with zipfile.ZipFile(jar) as built:
        service = built.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode()
        assert service.split() == [
            "io.bergstream.backfill.BackfillSource",
            "io.bergstream.backfill.HybridSource",
        ]
        assert "io/bergstream/backfill/EpochStream.class" in built.namelist()
        assert "io/bergstream/backfill/HybridStream.class" in built.namelist()
        assert "io/bergstream/router/PartitionRanges.class" in built.namelist()
    monkeypatch.setenv("PATH", "/nonexistent")  # no Maven: a built jar must not need it
    assert jars.project_jar() == jar


# Below a module's folder: its Java's package folder.
PACKAGES = Path("src", "main", "java", "io", "bergstream")


def java_parts_copy(root: Path) -> Path:
    """The checkout's Java build (its poms, every module of parts.xml) copied under `root`, each in the same
    place beside the others; the copy's parts.xml."""
    import shutil

    checkout = maven.PARTS.resolve().parents[4]
    parts = root / maven.PARTS.resolve().relative_to(checkout)
    parts.parent.mkdir(parents=True)
    for pom in (maven.POM, maven.PARTS):
        shutil.copyfile(pom, parts.parent / pom.name)
    for module in maven.modules():
        shutil.copytree(module, root / module.relative_to(checkout), ignore=shutil.ignore_patterns("target"))
    return parts


def test_a_java_error_names_the_file(tmp_path: Path) -> None:
    parts = java_parts_copy(tmp_path)
    broken = tmp_path / "backfill" / "jvm" / PACKAGES / "backfill" / "Plan.java"
    broken.write_text(broken.read_text().replace("final String table;", "final Strin table;"))
    with pytest.raises(BergstreamError, match=r"Maven could not build bergstream's Java: .*Plan\.java"):
        jars.project_jar(parts)


def test_a_change_to_a_java_source_is_built_anew_by_the_same_build(tmp_path: Path) -> None:
    import zipfile

    parts = java_parts_copy(tmp_path)
    built = jars.project_jar(parts)
    assert jars.project_jar(parts) == built, "built again with nothing changed"
    added = tmp_path / "router" / "jvm" / PACKAGES / "router" / "Added.java"
    added.write_text("package io.bergstream.router;\n\nfinal class Added {}\n")
    again = jars.project_jar(parts)
    assert again != built
    with zipfile.ZipFile(again) as jar:
        assert "io/bergstream/router/Added.class" in jar.namelist()


def test_packages_hand_spark_the_pinned_coordinates_and_bergstreams_jar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bergstream.catalog import CatalogConfig
    from bergstream.spark import session_conf

    monkeypatch.setenv(jars.JARS_ENVIRONMENT, "packages")
    catalog = CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "wh")
    conf = session_conf(catalog, conf={"spark.jars.packages": "org.example:extra:1.0"})
    assert conf["spark.jars"] == str(jars.project_jar())
    *pinned, extra = conf["spark.jars.packages"].split(",")
    assert extra == "org.example:extra:1.0"
    versions = jars.pinned_versions()
    spark_minor = ".".join(versions.spark.split(".")[:2])
    assert f"org.apache.spark:spark-sql-kafka-0-10_{versions.scala_binary}:{versions.spark}" in pinned
    runtime = f"iceberg-spark-runtime-{spark_minor}_{versions.scala_binary}"
    assert f"org.apache.iceberg:{runtime}:{versions.iceberg}" in pinned
    # The coordinates are those Maven resolves into the cache for spark.jars, at the same versions.
    resolved = jars.resolve("spark")
    for coordinate in pinned:
        group, artifact, version = coordinate.split(":")
        assert (resolved / group.replace(".", "/") / artifact / version).is_dir(), coordinate


def test_resolved_jars_are_the_default_and_an_unknown_source_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bergstream.errors import ConfigError

    monkeypatch.delenv(jars.JARS_ENVIRONMENT, raising=False)
    assert set(jars.spark_jar_conf()) == {"spark.jars"}
    monkeypatch.setenv(jars.JARS_ENVIRONMENT, "ivy")
    with pytest.raises(ConfigError, match="BERGSTREAM_JARS=ivy"):
        jars.spark_jar_conf()


def test_the_shipped_jar_is_used_without_sources_or_a_jdk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shipped = tmp_path / "jvm" / maven.PROJECT_JAR
    monkeypatch.setattr(jars, "SHIPPED_JAR", shipped)
    missing = tmp_path / "no-sources" / "parts.xml"
    with pytest.raises(BergstreamError, match="no Java sources to build it from"):
        jars.project_jar(missing)
    shipped.parent.mkdir()
    shipped.write_bytes(jars.project_jar().read_bytes())
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jars.project_jar(missing) == shipped
