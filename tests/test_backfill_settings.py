"""Application settings: refused at start with the file and the key named, flags over the file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from bergstream.backfill.errors import BackfillConfigError
from bergstream.runtime.checkpoint_names import backfill_checkpoint
from bergstream.runtime.settings import load_app_settings

CATALOG = {"uri": "jdbc:sqlite:/tmp/catalog.db", "warehouse": "file:///tmp/warehouse"}
DEFAULTS = {"kafka": {"kafka.bootstrap.servers": "127.0.0.1:9092"}, "catalog": CATALOG,
            "checkpoint_location": "/tmp/apps/sessionizer"}  # fmt: skip


def write(tmp_path: Path, **settings: Any) -> Path:
    content = {
        "app": "sessionizer",
        "entry": "bergstream.apps.sessionizer:sessionizer",
        "sources": {"playback": {"topic": "playback", "encoding": "json"}},
        "output_table": "apps.sessions",
        **settings,
    }
    path = tmp_path / "sessionizer.yaml"
    path.write_text(yaml.safe_dump(content))
    return path


def load(path: Path, **overrides: Any) -> Any:
    return load_app_settings("sessionizer", path, defaults=DEFAULTS, overrides=overrides)


def test_the_shipped_application_files_load() -> None:
    root = Path(__file__).parent.parent / "deploy" / "apps"
    for name in ("sessionizer", "attribution"):
        settings = load_app_settings(name, root / f"{name}.yaml", defaults=DEFAULTS, overrides={})
        assert settings.mode == "live"
        assert settings.backfill.max_misalignment == timedelta(minutes=15)
    # The join's state off the heap; the sessions' in Spark's default store, whose commits cost less.
    provider = "spark.sql.streaming.stateStore.providerClass"
    attribution = load_app_settings("attribution", root / "attribution.yaml", defaults=DEFAULTS, overrides={})
    assert attribution.spark.conf[provider].endswith(".RocksDBStateStoreProvider")
    sessionizer = load_app_settings("sessionizer", root / "sessionizer.yaml", defaults=DEFAULTS, overrides={})
    assert provider not in sessionizer.spark.conf


def test_flags_turn_a_live_application_into_a_backfill(tmp_path: Path) -> None:
    window = {"start": "2026-11-22T00:00:00Z", "end": "2026-11-22T06:00:00+01:00", "max_misalignment": "5m"}
    settings = load(write(tmp_path), mode="backfill", backfill=window)
    assert settings.mode == "backfill"
    assert settings.backfill.start == datetime(2026, 11, 22, tzinfo=UTC)
    assert settings.backfill.end == datetime(2026, 11, 22, 5, tzinfo=UTC)
    assert settings.backfill.max_misalignment == timedelta(minutes=5)
    unordered = load(write(tmp_path), mode="backfill", backfill={**window, "max_misalignment": "unordered"})
    assert unordered.backfill.max_misalignment is None


@pytest.mark.parametrize(
    ("settings", "overrides", "message"),
    [
        ({"sources": {}}, {}, "sources: .*at least one named source"),
        ({"entry": "bergstream.apps.sessionizer"}, {}, "entry: .*module:function"),
        ({"sources": {"playback": {"topic": "playback", "schema": "nope"}}}, {}, "sources.playback.schema"),
        ({"sources": {"playback": {"topic": "playback", "kafka": {"subscribe": "x"}}}}, {},
         "set by bergstream"),
        ({}, {"mode": "backfill"}, "a backfill needs start and end"),
        ({}, {"mode": "backfill", "backfill": {"start": "2026-11-22T00:00", "end": "2026-11-23T01:00Z"}},
         "has no time zone"),
        ({}, {"mode": "backfill", "backfill": {"start": "2026-11-23T00:00Z", "end": "2026-11-22T01:00Z"}},
         "is not after start"),
        ({"backfill": {"max_misalignment": "15 fortnights"}}, {}, "write a number and a unit"),
        ({"backfill": {"max_misalignment": "0s"}}, {}, "above zero"),
        ({"backfill": {"regions": []}}, {}, "regions is empty"),
        ({"surprise": 1}, {}, "surprise: Extra inputs are not permitted"),
        ({"app": "other"}, {}, "app is 'other'"),
        ({"sources": {"playback": {"topic": "playback", "schema_registry": {"url": "registry:8081"}}}}, {},
         r"sources\.playback\.schema_registry\.url"),
        ({"sources": {"playback": {"topic": "playback", "kafka": {"maxOffsetsPerTrigger": "1e5"}}}}, {},
         r"sources\.playback\.kafka\.maxOffsetsPerTrigger: '1e5' is not a positive integer"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_file_and_key(
    tmp_path: Path, settings: dict[str, Any], overrides: dict[str, Any], message: str
) -> None:
    path = write(tmp_path, **settings)
    with pytest.raises(BackfillConfigError, match=message) as refused:
        load(path, **overrides)
    assert str(path) in str(refused.value)


def test_a_sources_own_max_offsets_per_trigger_wins_over_the_applications(tmp_path: Path) -> None:
    sources = {
        "impression": {
            "topic": "impression",
            "encoding": "avro",
            "kafka": {"maxOffsetsPerTrigger": "250000"},
        },
        "playback": {"topic": "playback"},
    }
    settings = load(write(tmp_path, sources=sources, max_offsets_per_trigger=25_000))
    assert settings.max_offsets("impression") == 250_000
    assert settings.max_offsets("playback") == 25_000
    assert load(write(tmp_path, sources=sources)).max_offsets("playback") is None


def test_options_written_as_yaml_numbers_and_booleans_reach_spark_as_the_strings_it_takes(
    tmp_path: Path,
) -> None:
    sources = {
        "playback": {"topic": "playback", "kafka": {"maxOffsetsPerTrigger": 25000, "failOnDataLoss": False}}
    }
    spark = {"conf": {"spark.sql.shuffle.partitions": 2, "spark.sql.ansi.enabled": True,
                      "spark.memory.fraction": 0.5}}  # fmt: skip
    catalog = {**CATALOG, "properties": {"cache-enabled": False}}
    settings = load(
        write(tmp_path, sources=sources, spark=spark, catalog=catalog, kafka={"kafka.linger.ms": 5})
    )
    assert settings.sources["playback"].kafka == {"maxOffsetsPerTrigger": "25000", "failOnDataLoss": "false"}
    assert settings.max_offsets("playback") == 25_000
    assert settings.kafka == {"kafka.bootstrap.servers": "127.0.0.1:9092", "kafka.linger.ms": "5"}
    assert settings.spark.conf == {"spark.sql.shuffle.partitions": "2", "spark.sql.ansi.enabled": "true",
                                   "spark.memory.fraction": "0.5"}  # fmt: skip
    assert settings.catalog.properties == {"cache-enabled": "false"}
    # A list or a mapping is no option value: refused, naming the key.
    bad = {"playback": {"topic": "playback", "kafka": {"failOnDataLoss": [False]}}}
    with pytest.raises(
        BackfillConfigError, match=r"sources\.playback\.kafka\.failOnDataLoss: Input should be a valid string"
    ):
        load(write(tmp_path, sources=bad))


def test_a_live_source_without_a_broker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackfillConfigError, match=r"kafka\.bootstrap\.servers is missing for live source"):
        load_app_settings("sessionizer", write(tmp_path), defaults={"catalog": CATALOG,
                          "checkpoint_location": "/tmp/x"}, overrides={})  # fmt: skip


def test_each_backfill_request_has_a_checkpoint_of_its_own(tmp_path: Path) -> None:
    path = write(tmp_path)
    window = {"start": "2026-11-22T00:00:00Z", "end": "2026-11-23T00:00:00Z"}
    first = backfill_checkpoint(load(path, mode="backfill", backfill=window))
    assert first == backfill_checkpoint(load(path, mode="backfill", backfill=window)), (
        "the same command resumes"
    )
    other = backfill_checkpoint(load(path, mode="backfill", backfill={**window, "max_misalignment": "1h"}))
    regions = backfill_checkpoint(load(path, mode="backfill", backfill={**window, "regions": ["us-east-1"]}))
    assert len({first, other, regions, DEFAULTS["checkpoint_location"]}) == 4
    spark_words = load(path, mode="backfill", backfill={**window, "max_misalignment": "15 minutes"})
    assert spark_words.backfill.max_misalignment == timedelta(minutes=15)
    assert first.startswith("/tmp/apps/sessionizer-backfill-20261122T000000_20261123T000000_15m")


def test_an_applications_file_is_found_in_bergstream_apps_dir_else_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERGSTREAM_SITE", raising=False)
    monkeypatch.setenv("BERGSTREAM_APPS_DIR", str(tmp_path / "apps"))
    with pytest.raises(BackfillConfigError) as refused:
        load_app_settings("sessionizer", None, defaults=DEFAULTS, overrides={})
    assert str(refused.value).startswith(f"{tmp_path / 'apps' / 'sessionizer.yaml'}: no such file")
    assert "BERGSTREAM_APPS_DIR" in str(refused.value)
    (tmp_path / "apps").mkdir()
    write(tmp_path / "apps")
    assert load_app_settings("sessionizer", None, defaults=DEFAULTS, overrides={}).app == "sessionizer"


def test_a_registry_source_needs_no_schema_file(tmp_path: Path) -> None:
    """Its columns come from the subject's newest version when the run starts; its name alone is kept."""
    registry = {"url": "http://127.0.0.1:8081/", "subject": "plays-value"}
    source = {"topic": "plays", "schema": "no-such-file", "encoding": "avro", "schema_registry": registry}
    settings = load(write(tmp_path, sources={"playback": source}))
    loaded = settings.sources["playback"].schema_registry
    assert loaded is not None
    assert (loaded.url, loaded.subject_of("plays")) == ("http://127.0.0.1:8081", "plays-value")


def test_a_checkpoint_name_tells_windows_apart_to_the_microsecond_and_regions_in_any_order(
    tmp_path: Path,
) -> None:
    path = write(tmp_path)
    window = {"start": "2026-11-22T00:00:00Z", "end": "2026-11-23T00:00:00Z"}
    whole = backfill_checkpoint(load(path, mode="backfill", backfill=window))
    later = backfill_checkpoint(
        load(path, mode="backfill", backfill={**window, "start": "2026-11-22T00:00:00.5Z"})
    )
    assert whole != later and "20261122T000000500000_" in later
    regions = [["us-east-1", "eu-west-1"], ["eu-west-1", "us-east-1"]]
    named = {
        backfill_checkpoint(load(path, mode="backfill", backfill={**window, "regions": listed}))
        for listed in regions
    }
    assert len(named) == 1
