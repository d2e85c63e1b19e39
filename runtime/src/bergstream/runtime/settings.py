"""An application's settings: <apps dir>/<app>.yaml, then command-line flags, validated once at start.

The applications' folder is $BERGSTREAM_APPS_DIR, else the site settings' `apps_dir`, else deploy/apps under
the working directory; --config names one application's file anywhere.

An application reads named sources ("playback", "impression"). Each named source has a live side (a Kafka
topic, parsed as the router parses it) and a backfill side (the topic's archive table). `mode` picks one
for every source of the application; the `backfill` section says which window, which bound and which
regions a backfill reads. The application's code is the same either way.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bergstream.backfill.errors import BackfillConfigError
from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.kafka_source import isolation_level
from bergstream.schemas.event_schema import AVRO_DIR, Encoding, load_event_schema
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from bergstream.settings_file import OptionValue, layered, problems, read_mapping
from bergstream.site import settings_dir
from bergstream.spark import SparkSettings
from bergstream.timeparse import parse_duration, parse_instant

log = logging.getLogger(__name__)
APPS_DIR = Path("deploy/apps")
APPS_DIR_ENVIRONMENT = "BERGSTREAM_APPS_DIR"
BOOTSTRAP = "kafka.bootstrap.servers"
# live: Kafka; backfill: a window of the archive; bootstrap: the archive from a time, then Kafka.
Mode = Literal["live", "backfill", "bootstrap"]
# As max_misalignment: read the window in one epoch, in no order.
UNORDERED = "unordered"
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Set per source by bergstream: each named source reads exactly its topic.
_RESERVED_KAFKA_OPTIONS = ("subscribe", "subscribePattern", "assign")
MAX_OFFSETS = "maxOffsetsPerTrigger"
# A branch a correction writes: a name Spark takes in a table's identifier (table.branch_NAME).
BRANCH_NAME = r"^[A-Za-z][A-Za-z0-9_]{0,99}$"


class SourceSettings(BaseModel):
    """One named source: its topic when live, its archive table when backfilled."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    topic: str = Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")
    schema_name: str | None = Field(default=None, alias="schema")  # default: the topic's name
    encoding: Encoding = "json"
    # Live rows get this as __metadata__.cluster, as the router stamps it.
    cluster: str = "local"
    max_value_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # The archive table: T, namespace.T or catalog.namespace.T; default: the topic's name.
    table: str | None = None
    # Options of Spark's Kafka source for this topic alone, over the application's `kafka`.
    kafka: dict[str, OptionValue] = Field(default_factory=dict)
    # Live values in a schema registry's wire format, as the topic's router reads them; the source's columns
    # are the subject's newest version when the run starts.
    schema_registry: SchemaRegistrySettings | None = None

    @property
    def schema_or_topic(self) -> str:
        return self.schema_name or self.topic

    @property
    def table_or_topic(self) -> str:
        return self.table or self.topic


class BackfillSettings(BaseModel):
    """The window a backfill reads, and how much out of order it may read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: datetime | None = None
    end: datetime | None = None
    # B: None reads the window unordered, in one epoch.
    max_misalignment: timedelta | None = timedelta(minutes=15)
    strict: bool = False
    regions: list[str] | None = None
    # Set by `backfill run --branch`: start and end above are then the read window, which this one's
    # warm-up and settle widen.
    correct: CorrectionSettings | None = None

    @field_validator("start", "end", mode="before")
    @classmethod
    def _instant(cls, value: Any) -> Any:
        try:
            return parse_instant(value) if value is not None else None
        except ConfigError as error:
            raise ValueError(str(error)) from error

    @field_validator("max_misalignment", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None or isinstance(value, timedelta):
            return value
        if str(value).strip().lower() == UNORDERED:
            return None
        try:
            bound = parse_duration(str(value), "max_misalignment")
        except ConfigError as error:
            raise ValueError(str(error)) from error
        if bound <= timedelta(0):
            raise ValueError(f"{value!r}: the bound must be above zero; use strict for exact order")
        return bound

    @model_validator(mode="after")
    def _window(self) -> BackfillSettings:
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"end ({self.end.isoformat()}) is not after start ({self.start.isoformat()})")
        if self.regions is not None and not self.regions:
            raise ValueError("regions is empty: leave it out to read every region")
        return self


class CorrectionSettings(BaseModel):
    """A backfill that corrects a past window: written into branch `branch` of the output table, to replace
    main's rows whose time column falls in [start, end) once audited and published (backfill/correct)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    branch: str = Field(pattern=BRANCH_NAME)
    start: datetime
    end: datetime
    # The run that writes the branch: its checkpoint is named from it, so that a correction made again
    # under the same branch name never resumes an earlier one's query (correct/identity.py).
    run: str | None = None
    # The branch's earlier correction, if any, is released first (branch, tags, record, checkpoint, pins).
    start_over: bool = False


class OutputSettings(BaseModel):
    """What a correction needs to know of the application's output: which column places a row in time, which
    columns are a row's key, and how far before and after a window the backfill reads to compute that
    window's rows completely."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A timestamp column of the output: a publish replaces the rows whose value falls in its window.
    time_column: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # A timestamp column of the output where a row's span ends (a session's end, an hour's end): a row
    # covers [time_column, end_column). A row that spans the window's start or end is replaced whole.
    end_column: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # The columns that identify a row: the audit compares the branch's rows with main's by them.
    key: list[str] | None = None
    # Read before the window's start, its output not published: a session open at the start, a join's
    # other side. At least the longest span of a row (a session, a period plus its join window).
    warm_up: timedelta | None = None
    # Read past the window's end, for its rows to be complete: a row whose time is before the end is written
    # once the watermark passes its end. At least the longest span of a row plus the watermark delay.
    settle: timedelta | None = None

    @field_validator("warm_up", "settle", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: Any) -> Any:
        if value is None or isinstance(value, timedelta):
            return value
        try:
            duration = parse_duration(str(value), f"output.{info.field_name}")
        except ConfigError as error:
            raise ValueError(str(error)) from error
        if duration < timedelta(0):
            raise ValueError(f"{value!r}: a duration of zero or more")
        return duration

    @field_validator("key")
    @classmethod
    def _key(cls, key: list[str] | None) -> list[str] | None:
        if key is not None and (not key or len(set(key)) != len(key)):
            raise ValueError("a row's key is one column or more, each named once")
        return key

    def missing_for_correction(self) -> list[str]:
        """The settings a correction needs that are not given, each with what it is."""
        needed = {
            "time_column": "the output's timestamp column that places a row in time (session_start)",
            "end_column": "the output's timestamp column where a row's span ends (session_end)",
            "key": "the columns that identify a row ([account_id, session_start])",
            "warm_up": "how long before the window the backfill reads (the longest span of a row: 4h)",
            "settle": "how long past the window it reads for its rows to be complete (a row's longest span "
            "plus the watermark delay: 5h)",
        }
        return [f"output.{name}: {what}" for name, what in needed.items() if getattr(self, name) is None]


class AppSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    app: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    # The application: a function of the module that takes the run's context and returns its writer.
    entry: str
    mode: Mode = "live"
    sources: dict[str, SourceSettings]
    backfill: BackfillSettings = Field(default_factory=BackfillSettings)
    # Options of Spark's Kafka source shared by every live source (kafka.bootstrap.servers, ...).
    kafka: dict[str, OptionValue] = Field(default_factory=dict)
    catalog: CatalogConfig
    checkpoint_location: str
    trigger_interval: str = "30 seconds"
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    # Where the application's output is appended: T (in namespace apps), namespace.T or catalog.namespace.T.
    output_table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}$")
    # The output's time column and key, for corrections (backfill run --branch, audit, publish).
    output: OutputSettings = Field(default_factory=OutputSettings)
    # The application's own settings (its session gap, its watermark delay, ...), passed to it as they are.
    options: dict[str, Any] = Field(default_factory=dict)
    schema_dir: Path = AVRO_DIR

    @field_validator("entry")
    @classmethod
    def _entry(cls, entry: str) -> str:
        if not _ENTRY.match(entry):
            raise ValueError(
                f"{entry!r} is not module:function, such as bergstream.apps.sessionizer:sessionizer"
            )
        return entry

    @model_validator(mode="after")
    def _complete(self) -> AppSettings:
        if not self.sources:
            raise ValueError("sources: an application reads at least one named source")
        for name, source in self.sources.items():
            try:
                if source.schema_registry is None:
                    load_event_schema(source.schema_or_topic, self.schema_dir)
            except BackfillConfigError as error:
                raise ValueError(f"sources.{name}.schema: {error}") from error
            except Exception as error:
                raise ValueError(f"sources.{name}.schema: {error}") from error
            for key in {**self.kafka, **source.kafka}:
                if key in _RESERVED_KAFKA_OPTIONS:
                    raise ValueError(f"sources.{name}: option {key!r} is set by bergstream from `topic`")
            try:
                isolation_level({**self.kafka, **source.kafka})
            except ConfigError as error:
                raise ValueError(f"sources.{name}.kafka: {error}") from error
            own = source.kafka.get(MAX_OFFSETS)
            if own is not None and (not own.isdigit() or int(own) <= 0):
                raise ValueError(f"sources.{name}.kafka.{MAX_OFFSETS}: {own!r} is not a positive integer")
        if self.mode in ("live", "bootstrap"):
            missing = [n for n, s in self.sources.items() if BOOTSTRAP not in {**self.kafka, **s.kafka}]
            if missing:
                raise ValueError(f"kafka: {BOOTSTRAP} is missing for live source(s) {', '.join(missing)}")
        if self.backfill.correct is not None:
            if self.mode != "backfill":
                raise ValueError("backfill.correct: only a backfill writes into a branch")
            missing = self.output.missing_for_correction()
            if missing:
                raise ValueError(f"a correction (--branch) needs the output settings {'; '.join(missing)}")
        if self.mode == "backfill" and (self.backfill.start is None or self.backfill.end is None):
            raise ValueError("backfill: a backfill needs start and end (--start, --end)")
        if self.mode == "bootstrap":
            if self.backfill.start is None:
                raise ValueError("backfill: a bootstrap needs the time it reads the archive from (--from)")
            if self.backfill.end is not None:
                raise ValueError(
                    "backfill: a bootstrap reads the archive to its end, then Kafka: leave out end"
                )
            topics = [source.topic for source in self.sources.values()]
            if len(set(topics)) != len(topics):
                raise ValueError("sources: a bootstrap reads each topic into one source; two name the same")
        return self

    def kafka_options(self, source: str) -> dict[str, str]:
        return {**self.kafka, **self.sources[source].kafka}

    def max_offsets(self, source: str) -> int | None:
        """The most records a micro-batch reads of `source`'s topic: its own `maxOffsetsPerTrigger`, else the
        application's. Sources of ten times the records of another need ten times the limit for both to
        reach their end in the same micro-batch."""
        own = self.sources[source].kafka.get(MAX_OFFSETS)
        return int(own) if own is not None else self.max_offsets_per_trigger


def apps_dir(named: Path | None = None) -> Path:
    """The folder of the applications' settings files: `named`, else $BERGSTREAM_APPS_DIR, else the site
    settings' apps_dir, else deploy/apps under the working directory."""
    return settings_dir(named, APPS_DIR_ENVIRONMENT, "apps_dir", APPS_DIR)


def app_file(app: str, directory: Path | None = None) -> Path:
    return apps_dir(directory) / f"{app}.yaml"


def load_app_settings(
    app: str, config_file: Path | None, defaults: dict[str, Any], overrides: dict[str, Any]
) -> AppSettings:
    """Merge, from weakest to strongest: `defaults` (the site settings or the local stack), the app's YAML
    file, the flags."""
    path = config_file if config_file is not None else app_file(app)
    if not path.exists():
        raise BackfillConfigError(
            f"{path}: no such file; give the application's settings file with --config, or the folder of "
            f"<app>.yaml files with {APPS_DIR_ENVIRONMENT}"
        )
    try:
        merged = layered(path, "app", app, defaults, overrides)
    except ConfigError as error:
        raise BackfillConfigError(str(error)) from error
    try:
        return AppSettings.model_validate(merged)
    except ValidationError as error:
        raise BackfillConfigError(f"{path}: {problems(error)}") from error


def catalog_from_file(path: Path) -> CatalogConfig:
    """The `catalog` section of a settings file: an application's or a topic's."""
    if not path.exists():
        raise BackfillConfigError(f"{path}: no such file")
    loaded = read_mapping(path)
    if not isinstance(loaded.get("catalog"), dict):
        raise BackfillConfigError(f"{path}: has no catalog section")
    try:
        return CatalogConfig.model_validate(loaded["catalog"])
    except ValidationError as error:
        raise BackfillConfigError(f"{path}: {problems(error, 'catalog.')}") from error


def registry_from_file(path: Path) -> SchemaRegistrySettings | None:
    """The `schema_registry` section of a topic's settings file, login included; None where it has none."""
    if not path.exists():
        raise BackfillConfigError(f"{path}: no such file")
    section = read_mapping(path).get("schema_registry")
    if section is None:
        return None
    try:
        return SchemaRegistrySettings.model_validate(section)
    except ValidationError as error:
        raise BackfillConfigError(f"{path}: {problems(error, 'schema_registry.')}") from error


def correction(
    settings: AppSettings, branch: str, run: str | None = None, start_over: bool = False
) -> AppSettings:
    """The settings of a backfill that corrects its window [start, end) into branch `branch`: the window
    becomes the correction's, and the read window widens by the output's warm-up before it and settle
    after it."""
    backfill = settings.backfill
    missing = settings.output.missing_for_correction()
    if missing:
        raise BackfillConfigError(f"{settings.app}: a correction (--branch) needs {'; '.join(missing)}")
    if backfill.regions is not None:
        raise BackfillConfigError(
            f"{settings.app}: a correction replaces every region's rows of its window, and --region "
            f"({', '.join(backfill.regions)}) would read only some of their events: leave --region out"
        )
    assert backfill.start is not None and backfill.end is not None, "validated by AppSettings"
    assert settings.output.warm_up is not None and settings.output.settle is not None
    merged = settings.model_dump()
    merged["backfill"].update(
        start=backfill.start - settings.output.warm_up,
        end=backfill.end + settings.output.settle,
        correct=dict(branch=branch, start=backfill.start, end=backfill.end, run=run, start_over=start_over),
    )
    try:
        return AppSettings.model_validate(merged)
    except ValidationError as error:
        raise BackfillConfigError(f"{settings.app}: {problems(error)}") from error
