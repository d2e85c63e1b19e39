"""A router's settings: <topics dir>/<topic>.yaml, then command-line flags, validated once at start.

The topics' folder is the one named by --topics-dir, else $BERGSTREAM_TOPICS_DIR, else the site settings'
`topics_dir`, else deploy/topics under the working directory. Kafka options keep the names of Spark's Kafka
source (`kafka.bootstrap.servers`, `kafka.security.protocol`, `startingOffsets`, ...). Endpoints left out
(bootstrap servers, catalog) come from the site settings or the local stack.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.kafka_settings import librdkafka_settings
from bergstream.kafka_source import isolation_level
from bergstream.router.commit_policy import COMMIT_BYTES, COMMIT_RECORDS, CommitPolicy
from bergstream.router.maintenance_settings import (
    DEFAULT_SNAPSHOT_RETENTION_HOURS,
    MANY_SNAPSHOTS,
    MaintenanceSettings,
    duration_at_least,
)
from bergstream.router.retry import CommitRetrySettings
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX
from bergstream.schemas.batch_range import Origin
from bergstream.schemas.event_schema import AVRO_DIR, Encoding, load_event_schema
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from bergstream.settings_file import OptionValue, layered, problems
from bergstream.site import settings_dir
from bergstream.spark import SparkSettings
from bergstream.timeparse import parse_duration

log = logging.getLogger(__name__)
TOPICS_DIR = Path("deploy/topics")
TOPICS_DIR_ENVIRONMENT = "BERGSTREAM_TOPICS_DIR"
BOOTSTRAP = "kafka.bootstrap.servers"
# Set by the router itself: one topic per router, its own rate limit and its own consumer group.
_RESERVED_KAFKA_OPTIONS = {
    "subscribe": "the router reads exactly its topic; set `topic`",
    "subscribePattern": "the router reads exactly its topic; set `topic`, or run `router run --pattern`",
    "assign": "the router reads exactly its topic; set `topic`",
    "maxOffsetsPerTrigger": "use `max_offsets_per_trigger`",
    "includeHeaders": "the router always archives headers",
    "kafka.group.id": "Spark keeps its own group; the router commits to bergstream-router.<topic>",
}
_SOURCE_OPTIONS = {
    "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "failOnDataLoss", "minPartitions", "maxRecordsPerPartition",
    "minOffsetsPerTrigger", "maxTriggerDelay", "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs", "groupIdPrefix",
}  # fmt: skip
# What Spark's processing-time trigger accepts: a number, a space, a whole unit name.
_INTERVAL = re.compile(r"^\d+ +(milliseconds?|seconds?|minutes?|hours?|days?)$")
# Kafka's rule for topic names. A topic's name also names its settings file and checkpoint folder.
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
MIN_TARGET_LAG = timedelta(seconds=1)


# The options of Spark's Kafka source a router may set, and a processing-time trigger's interval.
KafkaOptions = Annotated[dict[str, OptionValue], AfterValidator(lambda options: check_kafka_options(options))]
TriggerInterval = Annotated[str, AfterValidator(lambda interval: check_trigger_interval(interval))]


class DeploySettings(BaseModel):
    """How `bergstream deploy` renders the router for a Spark cluster and for Kubernetes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The image holds bergstream, its Python dependencies and its jars (`bergstream jars resolve`).
    image: str = "bergstream:latest"
    namespace: str = Field(default="bergstream", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    kubernetes_api: str = "https://kubernetes.default.svc"
    executor_instances: int = Field(default=2, gt=0)
    executor_cores: int = Field(default=2, gt=0)
    executor_memory: str = Field(default="4g", pattern=r"^\d+[kmgt]?$")
    driver_memory: str = Field(default="2g", pattern=r"^\d+[kmgt]?$")
    driver_cpu: str = "1"
    metrics_port: int = Field(default=9464, gt=0, le=65535)
    # What runs the driver: a one-replica Deployment whose pod is the driver, or the Spark Operator's
    # SparkApplication (sparkoperator.k8s.io/v1beta2), which submits it and restarts it.
    workload: Literal["Deployment", "SparkApplication"] = "Deployment"
    # How the Prometheus Operator finds the router's and Spark's metrics; `none` leaves only the Service's
    # prometheus.io annotations, for a cluster without that operator.
    monitor: Literal["ServiceMonitor", "PodMonitor", "none"] = "ServiceMonitor"


# A write task per this many records of the previous batch (TopicSettings.records_per_write_task's default).
RECORDS_PER_WRITE_TASK = 20_000


@cache
def commit_policy(target_lag: str | None, commit_bytes: int, commit_records: int) -> CommitPolicy:
    """A topic's commit policy, asked for every topic at every batch and between batches: parsed once per
    set of values (a copy of the settings with other values gets its own)."""
    lag = None if target_lag is None else parse_duration(target_lag).total_seconds()
    return CommitPolicy(lag, commit_bytes, commit_records)


class QuerySettings(BaseModel):
    """The settings of a query that reads topics: its Kafka connection and source options, trigger, rate
    limit, checkpoint, catalog, Spark session, metrics, commit retries and deployment. A topic's file may set
    them (`RouterConfig.query`: a `--topic` router's query is its topic's), and a query's own settings are
    them (router/driver/settings.py's `DriverSettings`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str = "local"
    # Never printed: kafka.sasl.jaas.config holds a password.
    kafka: KafkaOptions = Field(repr=False)
    trigger_interval: TriggerInterval = "30 seconds"
    max_offsets_per_trigger: int | None = Field(default=1_000_000, gt=0)
    checkpoint_location: str
    catalog: CatalogConfig
    spark: SparkSettings = Field(default_factory=SparkSettings)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    lag_refresh_seconds: float = Field(default=15.0, gt=0)
    commit_retry: CommitRetrySettings = Field(default_factory=CommitRetrySettings)
    deploy: DeploySettings = Field(default_factory=DeploySettings)

    @property
    def trigger_seconds(self) -> float:
        return parse_duration(self.trigger_interval, "trigger_interval").total_seconds()

    def query_settings(self) -> dict[str, Any]:
        """These settings alone, to build another model of them from."""
        return {name: getattr(self, name) for name in QuerySettings.model_fields}

    def kafka_client_config(self) -> dict[str, str]:
        """The connection settings among the `kafka.*` options, for the router's own (librdkafka) clients."""
        return librdkafka_settings(self.kafka, prefix="kafka.")


class TopicSettings(BaseModel):
    """A topic's own settings: its schema and encoding, its table and files, when its files are committed,
    its maintenance. The same whichever query reads the topic (`RouterConfig`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    topic: str
    # A file name in `schema_dir`, never a path out of it. With a schema registry, only the schema's name.
    schema_name: str = Field(alias="schema", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    schema_dir: Path = AVRO_DIR
    encoding: Encoding
    # Values in a schema registry's wire format; the table's schema is the subject's newest version.
    schema_registry: SchemaRegistrySettings | None = None
    # One plain name inside the catalog's namespace: no dots, quotes or backquotes.
    table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    target_file_size_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    # At most this many tasks write a micro-batch; Spark's Kafka source makes one per partition, and each
    # writes a file per hour. Unset: the Spark application's default parallelism (its executor cores).
    write_tasks: int | None = Field(default=None, gt=0)
    # A batch gets one write task per this many records its predecessor read, up to write_tasks: a quiet
    # topic's small batches are written by one task, one file per hour, and the other cores stay free.
    records_per_write_task: int = Field(default=RECORDS_PER_WRITE_TASK, gt=0)
    # Values over this go to the dead-letter table; Kafka's own default limit is about 1 MiB.
    max_value_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    # How stale a topic's archive may get: its files are committed before its oldest record not committed
    # would be older than this at the next batch (`60s`, `5m`), or sooner when they add up to a commit's
    # worth (router/commit_policy.py). Unset: a commit every batch that has records.
    target_lag: str | None = None
    # A commit's worth: a topic's files are committed once this much is pending, whatever its target lag.
    commit_bytes: int = Field(default=COMMIT_BYTES, gt=0)
    commit_records: int = Field(default=COMMIT_RECORDS, gt=0)

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str) -> str:
        check_topic_name(topic)
        return topic

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        if table.endswith(DEAD_LETTER_SUFFIX):
            raise ValueError(f"{table!r} ends in {DEAD_LETTER_SUFFIX}, which names the dead-letter tables")
        return table

    @field_validator("target_lag", mode="before")
    @classmethod
    def _target_lag(cls, lag: object) -> str | None:
        return check_target_lag(lag)

    @model_validator(mode="after")
    def _schema_exists(self) -> TopicSettings:
        if self.schema_registry is not None:
            return self
        try:
            load_event_schema(self.schema_name, self.schema_dir)
        except ConfigError as error:
            raise ValueError(f"schema: {error}") from error
        return self

    @property
    def target_lag_seconds(self) -> float | None:
        return None if self.target_lag is None else parse_duration(self.target_lag).total_seconds()

    @property
    def commit_policy(self) -> CommitPolicy:
        return commit_policy(self.target_lag, self.commit_bytes, self.commit_records)

    @property
    def subject(self) -> str | None:
        """The schema registry's subject of the topic's values."""
        return None if self.schema_registry is None else self.schema_registry.subject_of(self.topic)

    @property
    def consumer_group(self) -> str:
        return f"bergstream-router.{self.topic}"


class RouterConfig(BaseModel):
    """A topic as a query reads it: the topic's own settings (`settings`) inside the settings of the query
    around it (`query`). A `--topic` router's query is its topic's own, and a topic in a query of several
    runs with that query's. A topic's file is flat: the query's keys in it are `query`'s (`flat`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settings: TopicSettings
    query: QuerySettings

    @classmethod
    def flat(cls, settings: Mapping[str, Any] | None = None, /, **more: Any) -> RouterConfig:
        """A topic's settings as its file has them, flat (`settings`, then `more`), its query's keys among
        its own (`split_query_keys`)."""
        return cls.model_validate(split_query_keys({**(settings or {}), **more}))

    @property
    def snapshot_retention_hours(self) -> float:
        """How long snapshots are kept: as set, else 72 hours, or as long as MANY_SNAPSHOTS triggers take
        when that is shorter (about 2.8 hours at a 1-second trigger): the commit cost stays bounded."""
        retention = self.settings.maintenance.snapshot_retention_hours
        if retention is not None:
            return retention
        return min(DEFAULT_SNAPSHOT_RETENTION_HOURS, MANY_SNAPSHOTS * self.query.trigger_seconds / 3600)

    @property
    def origin(self) -> Origin:
        """Where the router's rows come from; the topic's Kafka id is learnt from Kafka at start."""
        return Origin(self.settings.topic, self.query.cluster, isolation_level(self.query.kafka))

    def in_query(self, query: QuerySettings) -> RouterConfig:
        """The topic's settings as the query of `query`'s settings reads it (of a query's own settings, a
        `DriverSettings`, only its QuerySettings)."""
        return RouterConfig(settings=self.settings, query=QuerySettings(**query.query_settings()))


def check_target_lag(lag: object) -> str | None:
    if lag is None:
        return None
    return duration_at_least(
        str(lag),
        "target_lag",
        MIN_TARGET_LAG,
        "such as 60s or 5m",
        "or leave it out for a commit every batch",
    )


# The fields of a topic as a query reads it whose keys its file holds flat, side by side.
FLAT = frozenset(RouterConfig.model_fields)


def split_query_keys(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A topic's settings as its file has them, flat, split into the topic's own and its query's."""
    query = {key: value for key, value in flat.items() if key in QuerySettings.model_fields}
    return {"settings": {key: value for key, value in flat.items() if key not in query}, "query": query}


def flat_settings(config: RouterConfig, **dump: Any) -> dict[str, Any]:
    """A topic's settings flat, as its file has them (`dump`: pydantic's `model_dump` options)."""
    return {**config.query.model_dump(**dump), **config.settings.model_dump(by_alias=True, **dump)}


def check_kafka_options(options: dict[str, str]) -> dict[str, str]:
    """The options of Spark's Kafka source a router may set, with its bootstrap servers."""
    for key in options:
        if key in _RESERVED_KAFKA_OPTIONS:
            raise ValueError(f"option {key!r} is not allowed here: {_RESERVED_KAFKA_OPTIONS[key]}")
        if not key.startswith("kafka.") and key not in _SOURCE_OPTIONS:
            raise ValueError(
                f"unknown option {key!r}: Kafka client settings start with 'kafka.' "
                f"(kafka.security.protocol, ...); source options are {', '.join(sorted(_SOURCE_OPTIONS))}"
            )
    if BOOTSTRAP not in options:
        raise ValueError(f"{BOOTSTRAP} is missing")
    try:
        librdkafka_settings(options, prefix="kafka.")
        isolation_level(options)
    except ConfigError as error:
        raise ValueError(str(error)) from error
    return options


def check_trigger_interval(interval: str) -> str:
    if not _INTERVAL.match(interval.strip()):
        raise ValueError(f"{interval!r} is not an interval such as '30 seconds' or '2 minutes'")
    return interval.strip()


def table_for_topic(topic: str) -> str:
    """The table a topic is archived into unless its settings name one: its name, with every character
    a table name cannot hold (`.`, `-`) as `_`."""
    table = re.sub(r"[^A-Za-z0-9_]", "_", topic)
    return table if re.match(r"[A-Za-z_]", table) else f"_{table}"


def check_topic_name(topic: str) -> None:
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(
            f"{topic!r} is not a Kafka topic name: 1 to 249 of A-Z a-z 0-9 . _ -, and neither '.' nor '..'"
        )


def topics_dir(named: Path | None = None) -> Path:
    """The folder of the topics' settings files: `named` (--topics-dir), else $BERGSTREAM_TOPICS_DIR, else
    the site settings' topics_dir, else deploy/topics under the working directory."""
    return settings_dir(named, TOPICS_DIR_ENVIRONMENT, "topics_dir", TOPICS_DIR)


def topic_file(topic: str, directory: Path | None = None) -> Path:
    return topics_dir(directory) / f"{topic}.yaml"


def load_router_config(
    topic: str, config_file: Path | None, defaults: dict[str, Any], overrides: dict[str, Any]
) -> RouterConfig:
    """Merge, from weakest to strongest: `defaults`, the topic's YAML file (`config_file`, else
    <topics dir>/<topic>.yaml, which must exist), `overrides` (the flags)."""
    try:
        check_topic_name(topic)  # before it names a file to read
    except ValueError as error:
        raise ConfigError(f"topic: {error}") from error
    path = config_file if config_file is not None else topic_file(topic)
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such file; give the topic's settings file with --config, or the folder of "
            f"<topic>.yaml files with --topics-dir or {TOPICS_DIR_ENVIRONMENT}"
        )
    log.info("router settings for %s from %s", topic, path)
    merged = layered(path, "topic", topic, defaults, overrides)
    merged.setdefault("schema", topic)
    merged.setdefault("table", table_for_topic(topic))
    try:
        return RouterConfig.flat(merged)
    except ValidationError as error:
        raise ConfigError(f"{path}: {problems(error, flat=FLAT)}") from error
