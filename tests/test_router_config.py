"""Settings that would take a router outside its topic, its files or its namespace: refused at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from bergstream.errors import ConfigError
from bergstream.router.config import RouterConfig, flat_settings, load_router_config, topic_file
from bergstream.router.schedule import next_wait
from bergstream.router.table import maintained_properties

CATALOG = {"uri": "jdbc:sqlite:/data/catalog.db", "warehouse": "file:///data/warehouse"}
SETTINGS: dict[str, Any] = {
    "topic": "playback",
    "schema": "playback",
    "encoding": "json",
    "kafka": {"kafka.bootstrap.servers": "127.0.0.1:9092"},
    "checkpoint_location": "/data/checkpoints/playback",
    "catalog": CATALOG,
}


def settings_file(directory: Path, topic: str, **changes: Any) -> Path:
    path = directory / "router.yaml"
    path.write_text(yaml.safe_dump({**SETTINGS, "topic": topic, **changes}))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"catalog": {**CATALOG, "type": "glue"}}, "catalog.type: Input should be 'jdbc' or 'rest'"),
        ({"catalog": {**CATALOG, "warehouse": "w"}}, "catalog: Value error, catalog warehouse 'w' is"),
        ({"catalog": {**CATALOG, "warehouse": "./w"}}, "catalog: Value error, catalog warehouse './w' is"),
        ({"table": "other.playback"}, "table: String should match pattern"),
        ({"table": "../playback"}, "table: String should match pattern"),
        ({"table": "`archive`.`x`"}, "table: String should match pattern"),
        ({"table": "playback__dlq"}, "table: Value error, 'playback__dlq' ends in __dlq"),
        ({"schema": "../../tmp/evil"}, "schema: String should match pattern"),
        ({"target_lag": "often"}, "target_lag: Value error, target_lag 'often': write a number and a unit"),
        ({"target_lag": "0.5s"}, "target_lag: Value error, '0.5s': give a duration of at least 1s"),
        ({"commit_records": 0}, "commit_records: Input should be greater than 0"),
        ({"commit_bytes": "64MiB"}, "commit_bytes: Input should be a valid integer"),
    ],
)  # fmt: skip
def test_hostile_settings_are_refused_naming_the_file_and_key(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    path = settings_file(tmp_path, "playback", **changes)
    with pytest.raises(ConfigError) as refused:
        load_router_config("playback", path, defaults={}, overrides={})
    assert str(refused.value).startswith(f"{path}: ")
    assert message in str(refused.value)


def test_kafka_options_written_as_yaml_numbers_and_booleans_are_the_strings_spark_takes(
    tmp_path: Path,
) -> None:
    kafka = {**SETTINGS["kafka"], "kafka.fetch.max.wait.ms": 10, "failOnDataLoss": True}
    config = load_router_config("playback", settings_file(tmp_path, "playback", kafka=kafka), defaults={},
                                overrides={})  # fmt: skip
    assert config.query.kafka["kafka.fetch.max.wait.ms"] == "10"
    assert config.query.kafka["failOnDataLoss"] == "true"


def test_a_topic_s_file_holds_its_own_settings_and_its_query_s_side_by_side(tmp_path: Path) -> None:
    path = settings_file(tmp_path, "playback", target_lag="60s", trigger_interval="10 seconds")
    config = load_router_config("playback", path, defaults={}, overrides={})
    assert (config.settings.table, config.settings.target_lag) == ("playback", "60s")
    assert (config.query.trigger_interval, config.query.checkpoint_location) == (
        "10 seconds", SETTINGS["checkpoint_location"]
    )  # fmt: skip
    flat = flat_settings(config, mode="json")
    assert (flat["schema"], flat["target_lag"], flat["trigger_interval"]) == ("playback", "60s", "10 seconds")
    assert RouterConfig.flat(flat) == config


@pytest.mark.parametrize("topic", ["..", ".", "a/b", "../../etc/passwd", "a\\b", "x" * 250, "", "a\n"])
def test_a_topic_that_is_not_a_kafka_name_is_refused_before_any_file_is_read(
    tmp_path: Path, topic: str
) -> None:
    with pytest.raises(ConfigError, match=r"^topic: .* is not a Kafka topic name"):
        load_router_config(topic, None, defaults={}, overrides={})


@pytest.mark.parametrize("topic", ["..", "."])
def test_settings_built_in_code_are_held_to_the_same_rules(topic: str) -> None:
    with pytest.raises(ValidationError, match=r"topic\n  Value error, .* is not a Kafka topic name"):
        RouterConfig.flat({**SETTINGS, "topic": topic, "table": "t"})


def test_the_table_flag_is_held_to_the_same_rules(tmp_path: Path) -> None:
    path = settings_file(tmp_path, "playback")
    with pytest.raises(ConfigError, match="table: String should match pattern"):
        load_router_config("playback", path, defaults={}, overrides={"table": "archive.other"})
    assert load_router_config("playback", path, defaults={}, overrides={}).settings.table == "playback"


@pytest.mark.parametrize(
    ("in_file", "flag", "every"),
    [
        (None, None, "1h"),  # maintained by default
        ("30m", None, "30m"),
        ("off", None, None),  # YAML reads a bare off as false
        (None, "never", None),
        ("never", "2h", "2h"),
    ],
)
def test_the_router_maintains_its_tables_every_hour_unless_told_otherwise(
    tmp_path: Path, in_file: str | None, flag: str | None, every: str | None
) -> None:
    path = tmp_path / "router.yaml"
    maintenance = "" if in_file is None else f"maintenance:\n  every: {in_file}\n"
    path.write_text(yaml.safe_dump(SETTINGS) + maintenance)
    overrides = {"maintenance": None if flag is None else {"every": flag}}
    config = load_router_config("playback", path, defaults={}, overrides=overrides)
    assert config.settings.maintenance.every == every
    assert config.settings.maintenance.every_seconds == (
        None if every is None else {"1h": 3600, "30m": 1800, "2h": 7200}[every]
    )


def test_table_properties_derive_from_the_maintenance_settings() -> None:
    maintenance = {"snapshot_retention_hours": 0.5, "retain_last_snapshots": 7}
    wanted = maintained_properties(
        RouterConfig.flat({**SETTINGS, "table": "playback", "maintenance": maintenance})
    )
    assert wanted["history.expire.max-snapshot-age-ms"] == "1800000"
    assert wanted["history.expire.min-snapshots-to-keep"] == "7"
    assert wanted["write.metadata.delete-after-commit.enabled"] == "true"
    assert wanted["commit.manifest-merge.enabled"] == "true"


@pytest.mark.parametrize(
    ("trigger", "retention", "hours"),
    [
        ("30 seconds", None, 72),  # 8,640 snapshots: the default holds
        ("1 minute", None, 72),
        ("1 second", None, 10_000 / 3600),  # at most 10,000 snapshots
        ("10 seconds", None, 100_000 / 3600),
        ("500 milliseconds", None, 5_000 / 3600),
        ("1 second", 12, 12),  # as set, however many snapshots that is
        ("30 seconds", 0.25, 0.25),
    ],
)
def test_snapshot_retention_keeps_a_bounded_number_of_snapshots_unless_set(
    trigger: str, retention: float | None, hours: float
) -> None:
    maintenance = {} if retention is None else {"snapshot_retention_hours": retention}
    config = RouterConfig.flat(
        {**SETTINGS, "table": "playback", "trigger_interval": trigger, "maintenance": maintenance}
    )
    assert config.snapshot_retention_hours == pytest.approx(hours)
    age_ms = maintained_properties(config)["history.expire.max-snapshot-age-ms"]
    assert int(age_ms) == round(hours * 3_600_000)


def test_a_topic_without_its_file_is_refused_naming_the_path_and_where_else_to_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERGSTREAM_TOPICS_DIR", raising=False)
    monkeypatch.delenv("BERGSTREAM_SITE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_router_config("playback", None, defaults={}, overrides={})
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'deploy' / 'topics' / 'playback.yaml'}: no such file")
    assert "--config" in message and "--topics-dir" in message and "BERGSTREAM_TOPICS_DIR" in message


def test_the_topics_folder_is_the_flags_else_the_environments_else_the_sites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for folder in ("flag", "environment", "site/topics"):
        (tmp_path / folder).mkdir(parents=True)
        settings_file(tmp_path / folder, "playback", table=folder.replace("/", "_")).rename(
            tmp_path / folder / "playback.yaml"
        )
    site = tmp_path / "site" / "site.yaml"
    site.write_text("topics_dir: topics\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERGSTREAM_SITE", str(site))
    assert topic_file("playback") == tmp_path / "site" / "topics" / "playback.yaml"
    assert load_router_config("playback", None, defaults={}, overrides={}).settings.table == "site_topics"
    monkeypatch.setenv("BERGSTREAM_TOPICS_DIR", str(tmp_path / "environment"))
    assert load_router_config("playback", None, defaults={}, overrides={}).settings.table == "environment"
    assert topic_file("playback", tmp_path / "flag") == tmp_path / "flag" / "playback.yaml"


def test_a_failed_maintenance_run_is_tried_again_soon_then_less_often_never_later_than_its_time() -> None:
    hour = 3600.0
    assert next_wait(hour, 0) == hour
    assert [next_wait(hour, failures) for failures in (1, 2, 3, 6, 7, 20)] == [60, 120, 240, 1920, 3600, 3600]
    # An interval shorter than the first retry's wait: the interval.
    assert next_wait(30.0, 0) == next_wait(30.0, 1) == next_wait(30.0, 5) == 30.0


def test_conf_flags_lay_spark_settings_over_the_files(tmp_path: Path) -> None:
    from bergstream.cli.options import spark_overrides

    spark = {"conf": {"spark.sql.shuffle.partitions": 8, "spark.ui.enabled": False}}
    path = settings_file(tmp_path, "playback", spark=spark)
    flags = ("spark.sql.shuffle.partitions=2", "spark.driver.extraJavaOptions=-Da=b -Dc=d=e")
    config = load_router_config("playback", path, defaults={}, overrides={"spark": spark_overrides(flags)})
    assert config.query.spark.conf == {
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.driver.extraJavaOptions": "-Da=b -Dc=d=e",
    }


WINDOW_FLAGS = ["--start", "2026-11-22T00:00:00Z", "--end", "2026-11-22T01:00:00Z"]


@pytest.mark.parametrize(
    "command",
    [
        ["router", "run", "--topic", "playback"],
        ["router", "maintain", "--topic", "playback"],
        ["router", "redrive", "--topic", "playback"],
        ["backfill", "run", "--app", "sessionizer", *WINDOW_FLAGS],
        ["app", "run", "--app", "sessionizer"],
    ],
)
def test_a_conf_flag_without_a_value_is_refused_before_spark_starts(command: list[str]) -> None:
    from click.testing import CliRunner

    from bergstream.cli import cli

    refused = CliRunner().invoke(cli, [*command, "--conf", "spark.ui.enabled"])
    assert refused.exit_code == 2
    assert "'spark.ui.enabled': write KEY=VALUE" in refused.output


@pytest.mark.parametrize(
    "command",
    [
        ["router", "run", "--topic", "playback", "--available-now"],
        ["router", "run", "--pattern", "playback.*", "--available-now"],
        ["router", "maintain", "--topic", "playback"],
        ["router", "redrive", "--topic", "playback"],
        ["backfill", "run", "--app", "sessionizer", *WINDOW_FLAGS],
        [
            "backfill",
            "replay",
            "--table",
            "playback",
            "--to-topic",
            "again",
            *WINDOW_FLAGS,
            "--bootstrap-servers",
            "127.0.0.1:9",
        ],
        ["app", "run", "--app", "sessionizer", "--available-now"],
    ],
)
def test_a_command_that_fails_says_so_in_its_json_report_and_its_exit_code(
    command: list[str], tmp_path: Path
) -> None:
    """A scheduler reads one JSON document and the exit code, also when the command could not start."""
    from click.testing import CliRunner

    from bergstream.cli import cli

    missing = tmp_path / "missing.yaml"
    flag = "--defaults" if "--pattern" in command else "--config"
    failed = CliRunner().invoke(cli, [*command, flag, str(missing), "--json"])
    assert failed.exit_code != 0
    report = json.loads(failed.stdout)
    assert report["ok"] is False and report["command"] == " ".join(command[:2])
    assert str(missing) in report["error"], report
